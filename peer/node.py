"""A running peer: the overlay state machine driven by the asyncio transport and a clock.

The node moves bytes between the transport and :class:`overlay.machine.PeerMachine`,
calls its ``tick`` periodically and performs the actions it returns; it holds no
protocol logic. Around that it does the peer's I/O with the key server: enrolment,
the certificate of its link key for its listening address (mutual TLS on every peer
link unless ``insecure_transport``), directory registration (renewed before its
time-to-live runs out, vouching for the neighbours that answered), contact lookup
(roots and vouched members first), and fetching the next epoch's keys and link
certificate during the grace window before each rollover. Blocking HTTP calls run in
a worker thread so timers keep running.

A subscriber may take its keys from a bundle of ``bulk issue`` instead of enrolling
(:mod:`peer.bundle_file`). It cannot fetch the next epoch's keys: from the grace window on
it reads the bundle file again whenever the file changes and every ``BUNDLE_RETRY``
seconds, warning each time, until a bundle of the next epoch replaced the old one there;
when its keys expire without one it sets ``failed`` (``failure`` says why) for its owner
to stop it.

With ``http`` set, the node serves ``/healthz``, ``/metrics`` and ``/status`` on its own
loop (:mod:`peer.monitor`, :mod:`peer.metrics`); its counters come from the actions it
performs, so they agree with what it delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    PeerCertificateError,
    Predicate,
    canonical_address,
    parse_predicate,
)
from ibe_pubsub.keyserver import (
    BulkBundle,
    BundleError,
    KeyServerRequestError,
    SubscriberBundle,
    TransportCertificate,
)
from ibe_pubsub.overlay import (
    Action,
    Connected,
    Deliver,
    Log,
    Message,
    OverlayConfig,
    PeerMachine,
    Publish,
    Publishes,
    RootKit,
    Send,
    SubscriberKit,
    WireError,
    coalesce,
    decode,
    tree_status,
)
from ibe_pubsub.peer import bundle_file, enrolment
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.key_service import (
    KeyService,
    SingleKeyServer,
    ThresholdAccess,
    open_service,
)
from ibe_pubsub.peer.known_servers import KnownServers
from ibe_pubsub.peer.log_limits import RateLimit, limit_accept_errors
from ibe_pubsub.peer.retry import Backoff
from ibe_pubsub.peer.transport import (
    SOCKET_BUFFER,
    Transport,
    TransportError,
    join_address,
    split_address,
)
from ibe_pubsub.peer.waiting import WaitAnnouncer, in_daemon_thread

if TYPE_CHECKING:
    from ibe_pubsub.peer.metrics import PeerMetrics
    from ibe_pubsub.peer.monitor import Monitor

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[Deliver], None]
T = TypeVar("T")
#: Events waiting for processing beyond this are dropped (the peer is overloaded); reading
#: from their senders pauses long before (BACKLOG_DELAY), so only frames already read count.
MAX_EVENT_BACKLOG = 10_000
#: Seconds the oldest waiting event may have waited before the peer stops reading from the
#: senders of events (back-pressure); it reads them again below half of it.
BACKLOG_DELAY = 0.25
#: Seconds between looks at congested send queues while waiting for them to drain: a poll,
#: as waking at every frame written cost a busy root more CPU than the wait saved.
CONGESTION_RECHECK = 0.02
#: Neighbours vouched for per tree and renewal (the directory takes at most 32).
MAX_SEEN = 32
#: Seconds between a start-up call that found its key service down and the next try.
RESTART_PAUSE = 0.5
#: Seconds a leaving peer gives the key server to drop its directory entries.
LEAVE_TIMEOUT = 2.0
#: Seconds between readings of a bundle file that does not hold the next epoch's keys yet.
BUNDLE_RETRY = 10.0
#: Ports a peer listening on a port the system picks tries before it gives up, when the
#: key server says another identity's certificate names the port picked.
PORT_PICKS = 8
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


@dataclass(frozen=True)
class NodeOptions:
    """What a peer is (subscriber of ``subscribe`` or of ``bundle``, or root of ``roots``),
    where its keys come from (the key server at ``server``, where ``token`` is its
    identity's, or a ``threshold`` deployment) and how it runs."""

    server: str | None = None
    token: str = ""
    #: Keys from a threshold deployment instead of ``server`` (then ``token``, ``server_key``
    #: and ``known_servers`` are unused: the access file has a token per member).
    threshold: ThresholdAccess | None = None
    listen: str = "127.0.0.1:0"
    subscribe: str | None = None
    roots: tuple[str, ...] = ()
    #: A subscriber's bundle file from ``bulk issue`` (then ``subscribe``, if given, must lie
    #: inside its credentials, and narrows what is delivered).
    bundle: str | None = None
    #: The protocol's parameters; a generous failure timeout by default, since pairing work
    #: on a busy machine can stall a peer for seconds.
    overlay: OverlayConfig = field(default_factory=lambda: OverlayConfig(failure_timeout=10.0))
    max_credentials: int | None = 4
    fine_depth: int = 1
    tick: float = 0.2
    directory_ttl: int = 30
    #: Expected Ed25519 key of the key server (raw 32 bytes); None trusts on first use
    #: (recorded in ``known_servers``; with neither, whichever key the server presents).
    server_key: bytes | None = None
    known_servers: KnownServers | None = None
    #: CA certificates (PEM) to check the key server's TLS certificate with; None: the system's.
    ca_file: str | None = None
    #: Plaintext peer links that take every peer's claimed address on trust (experiments
    #: only): the default is mutual TLS under the key server's peer-link CA.
    insecure_transport: bool = False
    #: Kernel buffer bytes each way per peer connection (0: the kernel's default), see
    #: peer.transport.SOCKET_BUFFER.
    socket_buffer: int = SOCKET_BUFFER
    seed: int | None = None
    #: (host, port) of the local HTTP endpoint (/healthz, /metrics, /status); None: off.
    http: tuple[str, int] | None = None
    #: Host names the endpoint answers to besides IP addresses, localhost and its own host.
    http_allowed_hosts: tuple[str, ...] = ()
    #: Seconds to wait at start for a key server that refuses connections or says it is
    #: unavailable (starting, restarting), rather than fail at once; 0: do not wait.
    server_wait: float = 30.0


class NodeError(PeerError):
    """The peer cannot start (bad options, refused enrolment, no root to join)."""


class PeerNode:
    """One subscriber or root peer process' worth of state, run on the current event loop."""

    def __init__(self, options: NodeOptions) -> None:
        subscriber = options.subscribe is not None or options.bundle is not None
        if subscriber == bool(options.roots):
            raise NodeError("a peer is either a subscriber (--subscribe or --bundle) or a root "
                            "(--root)")
        if (options.server is None) == (options.threshold is None):
            raise NodeError("a peer's keys come from one key server (--server) or from a "
                            "threshold deployment (--threshold-file), not both or neither")
        if options.threshold is not None and options.bundle is not None:
            raise NodeError("a bundle comes from one key server (bulk issue): --bundle does "
                            "not go with --threshold-file")
        self.options = options
        self.rng = random.Random(options.seed)
        self.service = self._key_service(options)
        self.transport = Transport(self._received, secure=not options.insecure_transport,
                                   socket_buffer=options.socket_buffer)
        self.machine: PeerMachine | None = None
        self.predicate: Predicate | None = None
        self._bundle: BulkBundle | None = None
        #: The bundle file as it was when the next epoch's keys were last not in it.
        self._bundle_seen: bundle_file.Stamp | None = None
        self.ready = asyncio.Event()
        #: Set when the peer cannot go on (its bundle's keys expired); ``failure`` says why.
        self.failed = asyncio.Event()
        self.failure: str | None = None
        self.epoch_end = 0.0
        self._signers: dict[str, Ed25519PrivateKey] = {}
        #: The key of this peer's TLS links, certified by the key server for its address.
        self._link_key = Ed25519PrivateKey.generate()
        self._callbacks: list[DeliveryCallback] = []
        self._stopping = asyncio.Event()
        #: Set by :meth:`stop` while the machine hands its children over.
        self._leaving = False
        self._timer: asyncio.Task[None] | None = None
        self._refresh_at = 0.0
        self._next_tick = 0.0
        #: Events waiting for processing: (sender, its copies for this peer's virtual peers,
        #: when it arrived).
        self._events: deque[tuple[str, list[Publish], float]] = deque()
        #: Senders not read while the events wait too long (back-pressure).
        self._paused: set[str] = set()
        self._drainer: asyncio.Task[None] | None = None
        self._register_at = 0.0
        #: Directory renewals retried less and less often (and logged rarely) while they fail.
        self._renewals = Backoff("directory renewal", functools.partial(log.warning, "%s"))
        self._background: asyncio.Task[None] | None = None
        self._join_started = 0.0
        #: Seconds from the first join message to every virtual peer attached (0 for a root).
        self.join_seconds: float | None = None
        #: The identity and role the key server certified this peer's link key for.
        self.identity: str | None = None
        self.role = "root" if options.roots else "subscriber"
        #: Messages dropped before the machine saw them, by reason.
        self.dropped_by: Counter[str] = Counter()
        self.metrics: PeerMetrics | None = None
        self.monitor: Monitor | None = None
        if options.http is not None:  # the web stack loads only when asked for
            from ibe_pubsub.peer.metrics import PeerMetrics
            from ibe_pubsub.peer.monitor import Monitor

            self.metrics = PeerMetrics(self)
            self.monitor = Monitor(*options.http, {"/healthz": self._healthz,
                                                   "/metrics": self._metrics,
                                                   "/status": self._status},
                                   options.http_allowed_hosts)

    @staticmethod
    def _key_service(options: NodeOptions) -> KeyService:
        if options.threshold is None and not options.token:
            raise NodeError("a token is required: the identity's at the key server")
        try:
            return open_service(options.server, options.token, options.threshold,
                                options.ca_file, options.server_key, options.known_servers)
        except PeerError as exc:
            raise NodeError(str(exc)) from exc

    @property
    def _single(self) -> SingleKeyServer:
        """The key server of a peer with a bundle (which only one key server issues)."""
        assert isinstance(self.service, SingleKeyServer)
        return self.service

    # -- application API ----------------------------------------------------------------------

    def on_deliver(self, callback: DeliveryCallback) -> None:
        """Call ``callback(delivery)`` for every delivered event (with its epoch and whether
        it came as a stream)."""
        self._callbacks.append(callback)

    @property
    def address(self) -> str:
        return self.transport.address

    @property
    def attributes(self) -> list[str]:
        """The trees this peer is in."""
        assert self.machine is not None
        return sorted({vp.attribute for vp in self.machine.vpeers.values()})

    @property
    def event_backlog(self) -> int:
        """Events received and waiting for processing."""
        return len(self._events)

    def stats(self) -> dict[str, object]:
        transport = self.transport
        out: dict[str, object] = {
            "address": self.address, "epoch_end": self.epoch_end,
            "join_seconds": self.join_seconds, "cpu_seconds": time.process_time(),
            "transport": {"secure": transport.secure, "refused": dict(transport.refused),
                          "renewals": transport.renewals,
                          "expired_links": transport.expired_links,
                          "dropped": transport.dropped,
                          "dropped_by": dict(transport.dropped_by),
                          "missed": transport.missed,
                          "frames_sent": transport.frames_sent,
                          "frames_received": transport.frames_received}}
        drops: dict[str, object] = {"node": dict(self.dropped_by)}
        if self.machine is not None:
            counters = self.machine.stats.counts()
            drops["protocol"] = dict(counters.pop("dropped_by"))
            out |= counters | {"epochs": sorted(self.machine.epochs)}
        return out | {"drops": drops}

    def health(self) -> dict[str, object]:
        """Up, enrolled, and attached in every tree it needs (``ok`` says all three)."""
        machine = self.machine
        trees: dict[str, bool] = {}
        for vp in machine.vpeers.values() if machine is not None else ():
            trees[vp.attribute] = trees.get(vp.attribute, True) and vp.attached
        ok = (machine is not None and self.ready.is_set() and all(trees.values())
              and not self.failed.is_set() and not self._stopping.is_set())
        return {"ok": ok, "enrolled": machine is not None, "trees": trees,
                "stopping": self._stopping.is_set(), "failure": self.failure}

    def status(self) -> dict[str, object]:
        """Identity, role, epoch, the trees (positions, never credentials), the last join."""
        machine = self.machine
        return {"address": self.address, "identity": self.identity, "role": self.role,
                "epoch": machine.epoch if machine is not None else None,
                "key_expiry": self.epoch_end or None, "ready": self.ready.is_set(),
                "join_seconds": self.join_seconds,
                "trees": tree_status(machine) if machine is not None else {}}

    def _healthz(self) -> tuple[int, str, bytes]:
        from ibe_pubsub.peer.monitor import json_body

        health = self.health()
        return json_body(200 if health["ok"] else 503, health)

    def _metrics(self) -> tuple[int, str, bytes]:
        assert self.metrics is not None
        return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.exposition()

    def _status(self) -> tuple[int, str, bytes]:
        from ibe_pubsub.peer.monitor import json_body

        return json_body(200, self.status())

    # -- life cycle ---------------------------------------------------------------------------

    async def _wait_for_server(self, deadline: float, what: str = "keys") -> None:
        """Until the key server answers, up to ``deadline`` (monotonic), while it refuses
        connections or says it is unavailable: peers started with their key server, or
        while it restarts, join once it is up. Any other failure (a wrong host name, a
        certificate) ends the wait at once. Announced as waiting for ``what``."""
        announcer = WaitAnnouncer(self._awaited(what))
        while True:
            try:
                await announcer.wait(in_daemon_thread(self.service.probe))
                return
            except KeyServerRequestError as exc:
                if not exc.down or time.monotonic() > deadline:
                    raise
            announcer.tick()
            await asyncio.sleep(0.5)

    async def _through_restarts(self, what: str, step: Callable[[], T], deadline: float) -> T:
        """``step``, a start-up call to the key server for ``what``, in a thread. A key
        server that goes down after its first answer (it restarts) is waited for again, up
        to ``deadline``, and the step alone is taken again: a peer restarted beside it
        exited at once before."""
        warned = False
        while True:
            try:
                return await WaitAnnouncer(self._awaited(what)).wait(in_daemon_thread(step))
            except KeyServerRequestError as exc:
                if not exc.down or time.monotonic() > deadline:
                    raise
                log.log(logging.DEBUG if warned else logging.WARNING,
                        "%s went down while this peer asked for %s (%s); waiting for it to "
                        "answer again", self.service.where, what, exc)
                warned = True
            await self._wait_for_server(deadline, what)
            # The probe may answer while the step cannot (on a threshold deployment, t
            # members answer where a link certificate needs more): not in a tight loop.
            await asyncio.sleep(RESTART_PAUSE)

    def _awaited(self, what: str) -> str:
        return f"{what} from {self.service.where}"

    async def start(self) -> None:
        """Listen, enrol, register, join; returns once joining has begun (see ``ready``)."""
        limit_accept_errors(asyncio.get_running_loop(), RateLimit())
        # --server-wait bounds all the start's waiting for its key server together.
        deadline = time.monotonic() + self.options.server_wait
        await self._wait_for_server(deadline)
        host, port = split_address(self.options.listen)
        if port == 0:
            for held in await self._through_restarts(
                    "its held address", functools.partial(self._held_ports, host), deadline):
                with contextlib.suppress(TransportError):  # in use: try the next one
                    await self.transport.listen(host, held)
                    break
        if not self.transport.address:
            await self.transport.listen(host, port)
        try:
            canonical_address(self.address)
        except PeerCertificateError as exc:
            await self.transport.close(0)
            raise NodeError(f"--listen {self.options.listen}: {exc}") from exc
        if self.monitor is not None:
            from ibe_pubsub.peer.monitor import MonitorError

            try:
                self.monitor.start()
            except MonitorError as exc:
                await self.transport.close(0)
                raise NodeError(f"--http: {exc}") from exc
            log.info("serving /healthz, /metrics and /status at %s", self.monitor.url)
        try:
            await self._through_restarts("its keys", self._fetch_params, deadline)
            # Certified before the overlay machine is made with this peer's address: the
            # port may still change (_certify_listening).
            certificate = await self._certify_listening(host, port == 0, deadline)
            await self._through_restarts("its keys", self._enrol, deadline)
            assert self.machine is not None
            if certificate.certificate.binding.epoch < self.machine.epoch:
                # An epoch began between the two: that certificate would expire before the
                # refresh of these keys renews it (links refused as expired meanwhile).
                certificate = await self._through_restarts(
                    "its link certificate", functools.partial(self._certify, False), deadline)
            self._install_link_certificate(certificate)
        except Exception:
            await self.transport.close(0)
            await asyncio.to_thread(self.service.close)
            if self.monitor is not None:
                await self.monitor.stop()
            raise
        assert self.machine is not None
        if self.options.roots:
            await self._through_restarts("its directory entry", self._register, deadline)
            self.join_seconds = 0.0
            self.ready.set()
        else:
            contacts = await self._wait_for_contacts(deadline)
            self._join_started = time.monotonic()
            self._perform(self.machine.join(contacts, time.time()))
        self._timer = asyncio.get_running_loop().create_task(self._timers())

    async def stop(self) -> None:
        """Leave gracefully: hand children over and serve them until they have linked
        elsewhere (at most the overlay's ``leave_linger``), detach from parents, flush,
        close."""
        if self._stopping.is_set() or self._leaving:
            return
        self._leaving = True
        if self.machine is not None:
            self._perform(self.machine.leave(time.time()))
            deadline = time.monotonic() + self.machine.config.leave_linger
            while not self.machine.stopped and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # messages and ticks go on meanwhile
            if not self.machine.stopped:
                self._perform(self.machine.tick(max(time.time(),
                                                    self.machine.leaving_until or 0.0)))
        self._stopping.set()
        for task in (self._timer, self._drainer):
            if task is not None:
                task.cancel()
        await self.transport.close(flush_timeout=2.0)
        if self._background is not None:
            self._background.cancel()
        if self.ready.is_set():
            try:  # leave the directory at once rather than when the lease runs out
                await asyncio.to_thread(self.service.deregister, self.address, LEAVE_TIMEOUT)
            except KeyServerRequestError as exc:
                log.info("could not leave the directory: %s", exc)
        await asyncio.to_thread(self.service.close)
        if self.monitor is not None:
            await self.monitor.stop()

    # -- enrolment and the directory ----------------------------------------------------------

    def _fetch_params(self) -> None:
        self.service.fetch_params()

    def _enrol(self) -> None:
        """Its keys (from the key server, or its bundle) and its overlay machine, made with
        the address it is certified for."""
        service = self.service
        schema = service.pp.schema
        config = self.options.overlay
        crypto = service.crypto()
        rng = random.Random(self.rng.getrandbits(64))
        if self.options.roots:
            roots = []
            for attribute in self.options.roots:
                if attribute not in schema.names:
                    raise NodeError(f"the schema has no attribute {attribute!r} "
                                    f"(it has {', '.join(schema.names)})")
                signer = self._signers[attribute] = Ed25519PrivateKey.generate()
                kit, self.epoch_end = service.enrol_root(attribute, signer)
                roots.append(kit)
            self.machine = PeerMachine(self.address, crypto, config, rng, roots=roots)
        elif self.options.bundle is not None:
            self._bundle = bundle_file.open_bundle(self.options.bundle, self._single.checked,
                                                   "subscriber", self._single.client)
            self.epoch_end = self._bundle.keys.epoch_end
            self.machine = PeerMachine(self.address, crypto, config, rng,
                                       kit=self._bundle_kit(self._bundle))
        else:
            assert self.options.subscribe is not None
            self.predicate = parse_predicate(schema, self.options.subscribe)
            kit, self.epoch_end = service.enrol_subscriber(
                self.predicate, max_credentials=self.options.max_credentials,
                fine_depth=self.options.fine_depth)
            self.machine = PeerMachine(self.address, crypto, config, rng, kit=kit)
        # The suite runs on the event loop's thread: charge it CPU time, not waits for a core.
        self.machine.crypto.meter.clock = time.thread_time
        self.machine.crypto.open_epoch(self.machine.epoch, self.epoch_end)
        self._refresh_at = self._refresh_time()

    def _bundle_kit(self, bundle: BulkBundle) -> SubscriberKit:
        assert isinstance(bundle.keys, SubscriberBundle)
        params = self._single.checked
        wanted = bundle_file.event_filter(params.pp.schema, bundle, self.options.subscribe,
                                          "--subscribe")
        return enrolment.kit_from_bundle(params, bundle.keys, wanted)

    def _held_ports(self, host: str) -> list[int]:
        """Ports of ``host`` whose addresses the key server certified to this identity and
        still counts as its own, latest first: a peer restarted without a fixed port takes
        one of them again, so restarts do not use up the identity's cap of addresses. Only
        the identity's own token reads them, and an address another identity holds is never
        among them, so reusing one gives this peer no address it could not certify anyway."""
        try:
            prefix = canonical_address(join_address(host, 1)).rpartition(":")[0]
        except PeerCertificateError:
            return []  # start() says what is wrong with --listen
        held = (split_address(a["address"]) for a in self.service.held_addresses())
        return [port for held_host, port in held
                if join_address(held_host, 0).rpartition(":")[0] == prefix]

    def _certify(self, next_epoch: bool) -> TransportCertificate:
        """The key service's certificate of this peer's link key for its address."""
        return self.service.certify_link_key(self._link_key, [self.address], next_epoch)

    async def _certify_listening(self, host: str, picked: bool, deadline: float
                                 ) -> TransportCertificate:
        """The link certificate of the address this peer listens on. A port the system
        ``picked`` may be one another identity's peer listened on before: the key server
        refuses it (409 ``address_taken``) until that peer's certificate expires. The peer
        then listens on another port the system picks, holding each refused one meanwhile so
        that none is picked twice, up to ``PORT_PICKS`` ports."""
        refused: list[asyncio.Server] = []
        try:
            while True:
                try:
                    return await self._through_restarts(
                        "its link certificate", functools.partial(self._certify, False),
                        deadline)
                except KeyServerRequestError as exc:
                    if (not picked or exc.code != "address_taken"
                            or len(refused) + 1 == PORT_PICKS):
                        raise
                    why = str(exc)
                try:
                    refused.append(await self.transport.listen_elsewhere(host))
                except TransportError as exc:
                    raise NodeError(f"{why}, and no other port: {exc}") from exc
                log.warning("%s; listening on %s instead", why, self.address)
        finally:
            for server in refused:
                server.close()

    def _install_link_certificate(self, certificate: TransportCertificate) -> None:
        """New handshakes present it; open links are renewed by ``Transport.maintain``. A
        plaintext peer certifies its address only to own it in the directory."""
        binding = certificate.certificate.binding
        self.identity, self.role = binding.identity, binding.role
        if not self.transport.secure:
            return
        if self.transport.tls is None:
            self.transport.tls = self.service.peer_tls(self._link_key, certificate.pem)
        else:
            self.transport.tls.install(certificate.pem)

    def _refresh_time(self) -> float:
        """A random moment in the first half of the grace window before the rollover."""
        grace = self.service.grace
        return self.epoch_end - grace + self.rng.uniform(0.05, 0.5) * grace

    def _register(self) -> None:
        """Renew this peer's lease in each of its trees, vouching for the neighbours there
        that answered recently."""
        assert self.machine is not None
        role = "root" if self.options.roots else "subscriber"
        now = time.time()
        for attribute in self.attributes:
            self.service.register(self.address, attribute, role, self.options.directory_ttl,
                                  seen=self.machine.answered_recently(attribute, now)[:MAX_SEEN])
        self._register_at = time.time() + self.options.directory_ttl / 3

    def _lookup(self) -> dict[str, list[str]]:
        """Contacts per tree: its roots and the members another peer vouched for; members
        nobody vouched for only when there is nothing else, since anyone may register
        addresses it owns that never answer."""
        contacts = {}
        for attribute in self.attributes:
            doc = self.service.lookup(attribute)
            # its own address may still be listed, by this peer before a crash
            roots, members = ([e for e in doc[k] if e["address"] != self.address]
                              for k in ("roots", "members"))
            vouched = [e["address"] for e in roots + members if e["vouched"]]
            contacts[attribute] = vouched or [e["address"] for e in members]
        return contacts

    async def _wait_for_contacts(self, deadline: float, timeout: float = 30.0
                                 ) -> dict[str, list[str]]:
        """Contacts for every tree this peer joins; waits for the roots to register (and,
        up to ``deadline``, for a key server that restarts)."""
        announcer = WaitAnnouncer("peers in the directory", limit=timeout)
        while True:
            contacts = await self._through_restarts("contacts", self._lookup, deadline)
            missing = ", ".join(a for a, cs in contacts.items() if not cs)
            if not missing:
                return contacts
            if announcer.expired:
                raise NodeError(f"no peer of tree(s) {missing} in the directory")
            announcer.what = (f"a root or peer of tree(s) {missing} in the directory of "
                              f"{self.service.where}")
            announcer.tick()
            await asyncio.sleep(0.5)

    def _rekey(self) -> tuple[float, SubscriberKit | None, list[RootKit], TransportCertificate]:
        """Keys and link certificate of the next epoch, and its end (in a worker thread). Of
        the epoch now current once its rollover has passed: a peer that could not renew
        during the grace window (the key server down, or this peer too busy) catches up
        then, while its old keys and certificate are still in their grace, instead of
        asking for the epoch after, which the key server refuses until that one's grace."""
        if self.options.bundle is not None and self._bundle is not None:
            bundle = bundle_file.next_bundle(self.options.bundle, self._single.checked,
                                             self._bundle)
            kit = self._bundle_kit(bundle)
            certificate = self._certify(next_epoch=time.time() < self.epoch_end)
            self._bundle = bundle
            return bundle.keys.epoch_end, kit, [], certificate
        next_epoch = time.time() < self.epoch_end
        certificate = self._certify(next_epoch=next_epoch)
        if self.options.roots:
            roots = []
            end = 0.0
            for attribute, signer in self._signers.items():
                root, end = self.service.enrol_root(attribute, signer, next_epoch=next_epoch)
                roots.append(root)
            return end, None, roots, certificate
        assert self.predicate is not None
        kit, end = self.service.enrol_subscriber(
            self.predicate, next_epoch=next_epoch,
            max_credentials=self.options.max_credentials, fine_depth=self.options.fine_depth)
        return end, kit, [], certificate

    def _bundle_changed(self) -> bool:
        """Whether the bundle file changed since it last lacked the next epoch's keys."""
        if self._bundle_seen is None:
            return False
        assert self.options.bundle is not None
        return bundle_file.stamp(self.options.bundle) != self._bundle_seen

    def _install_next(self, end: float, kit: SubscriberKit | None, roots: list[RootKit],
                      certificate: TransportCertificate) -> None:
        """The next epoch's keys and link certificate, in use from now on."""
        assert self.machine is not None
        self._bundle_seen = None
        # Keys of the ending epoch stay valid until its end plus the server's grace.
        now = time.time()
        grace = max(0.0, self.epoch_end + self.service.grace - now)
        self._perform(self.machine.rekey(now, kit=kit, roots=roots, grace=grace))
        self._install_link_certificate(certificate)
        self.epoch_end = end
        self.machine.crypto.open_epoch(self.machine.epoch, end)
        self._refresh_at = self._refresh_time()
        log.info("keys of the next epoch installed (valid until %.0f)", end)

    async def _background_work(self, now: float) -> None:
        """Key refresh and directory renewal; failures are logged and retried later."""
        assert self.machine is not None
        expiry = self.epoch_end + self.service.grace
        if self._bundle is not None and now >= expiry:
            self.failure = (f"the keys of epoch {self._bundle.keys.epoch} from bundle "
                            f"{self.options.bundle} expired at {bundle_file.when(expiry)}, "
                            "and no bundle of the next epoch replaced it")
            self.failed.set()
            return
        if now >= self._refresh_at or self._bundle_changed():
            seen = None if self.options.bundle is None else bundle_file.stamp(self.options.bundle)
            try:
                end, kit, roots, certificate = await asyncio.to_thread(self._rekey)
            # refused or unreachable: retry later
            except (KeyServerRequestError, BundleError) as exc:
                if self._bundle is None:
                    log.warning("fetching the next keys failed: %s", exc)
                    self._refresh_at = now + 2.0
                else:
                    log.warning("%s; the keys of epoch %d expire at %s, and the peer stops "
                                "then: put the next epoch's bundle there", exc,
                                self._bundle.keys.epoch, bundle_file.when(expiry))
                    self._refresh_at, self._bundle_seen = now + BUNDLE_RETRY, seen
            else:
                if self._bundle is None and end <= self.epoch_end:
                    # This peer's clock runs ahead of the key server's, which answered with
                    # the epoch this peer holds: its rollover is still to come there.
                    self._refresh_at = now + 1.0
                else:
                    self._install_next(end, kit, roots, certificate)
        if self.ready.is_set() and now >= self._register_at:
            try:
                await asyncio.to_thread(self._register)
                contacts = await asyncio.to_thread(self._lookup)
            except KeyServerRequestError as exc:
                self._register_at = now + self._renewals.failed(now, exc)
            else:
                self._renewals.succeeded()
                self.machine.set_contacts({a: cs for a, cs in contacts.items() if cs})

    # -- driving the machine ------------------------------------------------------------------

    async def _timers(self) -> None:
        assert self.machine is not None
        while not self._stopping.is_set():
            due = time.monotonic() + self.options.tick
            await asyncio.sleep(self.options.tick)
            if time.monotonic() - due > self.options.tick:
                # The loop was busy (crypto): read what queued up before judging silence.
                for _ in range(8):
                    await asyncio.sleep(0)
            now = time.time()
            if now >= self._next_tick:
                self._tick(now)
            # Re-handshake links at the rollover, by when every live peer holds its next
            # certificate, leaving the grace period for the old connections to drain.
            self.transport.maintain(now, renew_before=self.service.grace)
            if not self.ready.is_set() and all(vp.attached for vp in
                                                self.machine.vpeers.values()):
                self.join_seconds = time.monotonic() - self._join_started
                self.ready.set()
                self._register_at = now  # join the directory as a contact for others
            if self._background is None or self._background.done():
                self._background = asyncio.get_running_loop().create_task(
                    self._background_work(now))

    def _received(self, sender: str, payload: bytes) -> None:
        """Control messages at once; events queued behind them. Event processing costs
        pairings, and a backlog of events must not delay heartbeats and joins, or links
        are taken for failed while their answers wait in the queue."""
        if self.machine is None or self._stopping.is_set():
            return
        try:
            message = decode(payload)
        except WireError as exc:
            self.dropped_by["malformed_message"] += 1
            log.warning("dropped a malformed message from %s: %s", sender, exc)
            return
        copies = (message.expand() if isinstance(message, Publishes)
                  else [message] if isinstance(message, Publish) else None)
        if self.metrics is not None:
            for m in copies or [message]:
                self.metrics.received(m)
        if copies is not None:
            if len(self._events) >= MAX_EVENT_BACKLOG:
                self.dropped_by["backlog_full"] += 1
                log.warning("event backlog full: dropped an event from %s", sender)
                return
            now = time.time()
            self._events.append((sender, copies, now))
            if now - self._events[0][2] > BACKLOG_DELAY and sender not in self._paused:
                self._paused.add(sender)
                self.transport.pause_reading(sender)
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.get_running_loop().create_task(self._drain_events())
            return
        self._handle(sender, [message])

    def _handle(self, sender: str, messages: Sequence[Message],
                arrived: float | None = None) -> None:
        """Have the machine take ``messages`` (the copies of an event that ``arrived`` then,
        or one control message) and act on all they caused at once, so that the copies of
        an event for one neighbour leave as one frame (:func:`overlay.actions.coalesce`)."""
        assert self.machine is not None
        now = time.time()
        actions: list[Action] = []
        for message in messages:
            try:
                actions += self.machine.receive(sender, message, now)
            except Exception:  # the other copies' work stands
                log.exception("processing a %s from %s failed", type(message).__name__,
                              sender)
        self._perform(actions, arrived)
        if now >= self._next_tick:
            self._tick(now)

    async def _drain_events(self) -> None:
        while self._events and not self._stopping.is_set():
            if self.transport.congested():  # a neighbour reads slowly: wait for it
                await asyncio.sleep(CONGESTION_RECHECK)
                continue
            sender, copies, arrived = self._events.popleft()
            try:
                self._handle(sender, copies, arrived)
            except Exception:
                log.exception("processing an event from %s failed", sender)
            self._resume_reading()
            await asyncio.sleep(0)  # let control messages in between
        self._resume_reading()

    def _resume_reading(self) -> None:
        """Read the senders paused for the backlog again once it is short enough."""
        if self._paused and (not self._events
                             or time.time() - self._events[0][2] < BACKLOG_DELAY / 2):
            for sender in self._paused:
                self.transport.resume_reading(sender)
            self._paused.clear()

    def _tick(self, now: float) -> None:
        assert self.machine is not None
        self._next_tick = now + self.options.tick
        self._perform(self.machine.tick(now))

    def _perform(self, actions: list[Action], arrived: float | None = None) -> None:
        metrics = self.metrics
        if metrics is not None:  # each copy, before they are merged
            for action in actions:
                if isinstance(action, Send):
                    metrics.sent(action.message)
        for action in coalesce(actions):
            if isinstance(action, Send):
                self.transport.send(action.to, action.message.to_bytes())
            elif isinstance(action, Deliver):
                self._deliver(action)
                if metrics is not None:
                    metrics.delivered(time.time() - (arrived or action.at))
            elif isinstance(action, Log):
                log.log(_LEVELS.get(action.level, logging.INFO), "%s", action.text)
            elif isinstance(action, Connected):
                if metrics is not None:
                    metrics.connected(action)
                log.info("%s tree: virtual peer %s linked to %s (link %d) in %.3f s",
                         action.attribute, action.vp, action.parent, action.link,
                         action.at - action.started_at)

    def _deliver(self, delivery: Deliver) -> None:
        for callback in self._callbacks:
            try:
                callback(delivery)
            except Exception:
                log.exception("delivery callback failed on event %s", delivery.event.event_id)
