"""The publisher side: enrol for an advertisement, encrypt and sign, send to every tree's root.

A publisher does not listen and runs no overlay machine: it dials the roots found in the
directory and its events enter each attribute tree there
(:func:`overlay.actions.publication`), encrypted by the same crypto suite that peers
decrypt with. Its
link key is certified with no address, so roots know it as a publisher that can be
answered but never dialed. An event outside the advertisement is refused here,
before anything is sent. With a stream window, events are published as a stream
(credentials.streams): one session certificate, then the header reused while every value
stays in its cell. With a bundle of ``bulk issue`` instead of enrolment, the
advertisement is what the bundle's credentials enclose, or a narrower one inside them
(:mod:`peer.bundle_file`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    Event,
    EventFilter,
    NotAuthorized,
    Stream,
    StreamWindow,
    parse_predicate,
    streams,
)
from ibe_pubsub.keyserver import PublisherBundle
from ibe_pubsub.overlay import RealCrypto, coalesce, publication
from ibe_pubsub.peer import bundle_file, enrolment
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.key_service import (
    KeyService,
    SingleKeyServer,
    ThresholdAccess,
    open_service,
)
from ibe_pubsub.peer.known_servers import KnownServers
from ibe_pubsub.peer.transport import Backoff, Transport
from ibe_pubsub.peer.waiting import WaitAnnouncer, in_daemon_thread

log = logging.getLogger(__name__)

#: A publisher's only neighbours are the roots, and a root that restarts is back after
#: seconds: its events wait for it about half a minute (16 dials, backoff capped at 3 s) before they
#: are dropped, where a peer gives up on a neighbour after about 2.5 s (its heartbeats
#: find another one).
ROOT_BACKOFF = Backoff(attempts=16)


class PublishRefused(PeerError):
    """The event was not sent: outside the advertisement, or the keys do not cover it."""


class EventPublisher:
    """Publish events with keys issued for ``advertisement`` in the current epoch, or taken
    from ``bundle``; the key server's key is trusted as in
    :func:`peer.enrolment.fetch_params`. With ``threshold`` instead of ``server`` (and
    ``token``), the keys are combined from ``t`` members of a threshold deployment."""

    def __init__(self, server: str | None, token: str, advertisement: str | None,
                 server_key: bytes | None = None, known_servers: KnownServers | None = None,
                 ca_file: str | None = None, insecure_transport: bool = False,
                 bundle: str | None = None, stream_window: StreamWindow | None = None,
                 threshold: ThresholdAccess | None = None) -> None:
        if (server is None) == (threshold is None):
            raise PeerError("a publisher's keys come from one key server or from a threshold "
                            "deployment, not both or neither")
        if threshold is not None and bundle is not None:
            raise PeerError("a bundle comes from one key server (bulk issue), not from a "
                            "threshold deployment")
        self.service: KeyService = open_service(server, token, threshold, ca_file, server_key,
                                                known_servers)
        self.advertisement_text = advertisement
        self.bundle = bundle
        self.transport = Transport(self._received, secure=not insecure_transport,
                                   backoff=ROOT_BACKOFF)
        self.keys: enrolment.Publisher | None = None
        self.roots: dict[str, str] = {}
        self.crypto: RealCrypto | None = None
        self.stream_window = stream_window
        self.stream: Stream | None = None
        self.sent = 0

    @property
    def advertisement(self) -> EventFilter:
        assert self.keys is not None
        return self.keys.advertisement

    async def start(self, root_timeout: float = 30.0) -> None:
        """Enrol (KeyServerRequestError if refused) and find the root of every tree."""
        await self.enrol()
        await self.find_roots(root_timeout)

    async def enrol(self) -> None:
        """Publisher keys of the current epoch (KeyServerRequestError if refused)."""
        await WaitAnnouncer(f"publisher keys from {self.service.where}"
                            ).wait(in_daemon_thread(self._enrol))

    async def find_roots(self, root_timeout: float = 30.0) -> None:
        """The root of every attribute tree, from the directory (waits for them)."""
        announcer = WaitAnnouncer("the roots to register", limit=root_timeout)
        while True:
            self.roots = await in_daemon_thread(self._lookup_roots)
            missing = ", ".join(sorted(set(self.service.pp.schema.names) - set(self.roots)))
            if not missing:
                break
            if announcer.expired:
                raise PublishRefused(f"no root registered for {missing}")
            announcer.what = f"the root(s) of {missing} to register with {self.service.where}"
            announcer.tick()
            await asyncio.sleep(0.5)

    def _enrol(self) -> None:
        service = self.service
        service.fetch_params()
        self.crypto = service.crypto()
        if self.bundle is not None:
            assert isinstance(service, SingleKeyServer)
            params = service.checked
            bundle = bundle_file.open_bundle(self.bundle, params, "publisher", service.client)
            assert isinstance(bundle.keys, PublisherBundle)
            wanted = bundle_file.event_filter(params.pp.schema, bundle, self.advertisement_text,
                                              "--advertise")
            self.keys = enrolment.Publisher(bundle.keys.epoch, bundle.keys.epoch_end, wanted,
                                            bundle.keys.keys)
        else:
            assert self.advertisement_text is not None
            advertisement = parse_predicate(service.pp.schema, self.advertisement_text)
            self.keys = service.enrol_publisher(advertisement)
        if self.stream_window is not None:
            self.stream = Stream(service.pp, self.keys.keys, self.stream_window,
                                 int(self.keys.epoch_end))
        if self.transport.secure:
            key = Ed25519PrivateKey.generate()
            certificate = service.certify_link_key(key, [])
            self.transport.tls = service.peer_tls(key, certificate.pem)

    def _lookup_roots(self) -> dict[str, str]:
        roots = {}
        for attribute in self.service.pp.schema.names:
            found = self.service.lookup(attribute, sample=0)["roots"]
            if found:
                roots[attribute] = found[0]["address"]
        return roots

    def publish(self, event: Event) -> None:
        """Encrypt, sign and queue ``event`` for every root (sent by the event loop)."""
        self.send(self.encrypt(event))

    def encrypt(self, event: Event) -> bytes:
        """``event`` encrypted and signed, or PublishRefused. It touches no event loop, so
        it may run in a worker thread (one at a time: a stream's state is not shared)."""
        assert self.crypto is not None and self.keys is not None
        if not self.advertisement.matches(event.values):
            raise PublishRefused(f"event {event.event_id!r} lies outside the advertisement")
        try:
            return self.crypto.encrypt(
                self.keys.keys if self.stream is None else self.stream, event)
        except NotAuthorized as exc:
            raise PublishRefused(f"event {event.event_id!r}: {exc}") from exc

    @property
    def frames_per_event(self) -> int:
        """Frames an event costs the send queues: one per root process (the copies for the
        trees one process roots travel as one frame)."""
        return len(set(self.roots.values()))

    def prepare(self, busy: Callable[[], bool]) -> None:
        """Between events, a stream's next header, a step at a time until it is ready or
        ``busy()`` says an event waits (:func:`credentials.streams.prepare_next_header`);
        in the thread that encrypts."""
        while (self.stream is not None and not busy()
               and streams.prepare_next_header(self.stream)):
            pass

    def send(self, ciphertext: bytes) -> None:
        """Queue an encrypted event for every root (on the event loop)."""
        for send in coalesce(publication(ciphertext, self.roots)):
            self.transport.send(send.to, send.message.to_bytes())
        self.sent += 1

    async def close(self, flush_timeout: float = 10.0) -> bool:
        """Send what is queued; False if some of it could not be written to a root."""
        flushed = await WaitAnnouncer("the roots to take every event", limit=flush_timeout
                                      ).wait(self.transport.flush(flush_timeout))
        await self.transport.close(0, linger=flush_timeout)
        await asyncio.to_thread(self.service.close)
        return flushed and not self.transport.dropped

    def _received(self, sender: str, payload: bytes) -> None:
        log.debug("ignored %d bytes from %s (a publisher takes no messages)", len(payload),
                  sender)
