"""Asyncio TCP transport: one logical link per neighbour address, frames in and out.

The overlay names peers by their dialable address ``host:port``. A link dials on
the first send, redials with exponential backoff and jitter when the connection
drops, and gives up (dropping what was queued, with a log line) after a bounded
number of attempts: the overlay's heartbeats decide whether a neighbour is gone.
When two peers dial each other at once, both keep writing on the newest connection
dialed by the smaller address and close the others after a short drain, so each pair
settles on one connection; a side that moves to a newer connection ends the older one
with an END frame, and the receiver keeps the newer one's frames until then, so frames
stay in order; it keeps no more than :class:`HoldLimits` allows, and stops reading a
connection whose next frame would pass a cap until there is room. A message to the
peer's own address is handed back to it without a socket. A peer that does not listen (a
publisher) says hello with an empty address and is named ``~host:port`` by the other
side; it can be answered while connected but never dialed.

A secure transport (the default) runs mutual TLS 1.3 on every connection with the
credentials in :class:`peer.tls.PeerTLS`, and a peer's name is an address its certificate
binds, never a claim: a dialer's HELLO must name an address of its certificate (or none),
and a dialed peer's certificate must name the address dialed. The credentials may arrive
after :meth:`Transport.listen` (the certificate names the address listened on); until
then connections are refused and nothing is dialed. Refusals are counted by reason in
:attr:`Transport.refused`. A connection lives no longer than the earlier of the two
certificates it was made with: :meth:`Transport.maintain` closes expired ones and,
shortly before expiry, has the preferred dialer make a fresh connection with the renewed
certificate before the old one drains (make-before-break).

Overload is met with back-pressure, and what is dropped is counted and told. A node asks
:meth:`Transport.congested` before it takes more events: a connected link whose oldest
frame has waited over :data:`CONGESTED_AFTER` holds it back, so a tree runs at the pace
of its readers, and a node whose own events wait stops reading their sender
(:meth:`Transport.pause_reading`), which slows that sender in turn, up to the publisher. A
reader that stalls must not stall the tree: a link whose oldest frame waited
:data:`HOLD_LIMIT` is *slow*: it
holds nothing back until it has caught up (its oldest frame is fresh again), and its
frames that waited :data:`MAX_QUEUE_DELAY` since it connected are dropped
(``queue_delay``), never written late. Every dropped
frame is counted by reason in :attr:`Transport.dropped_by` and told to the peer with a GAP
frame, ahead of the next frame or alone, which the peer counts in :attr:`Transport.missed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import socket
import ssl
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ibe_pubsub.credentials import PeerCertificate, PeerCertificateError, escape
from ibe_pubsub.peer import frames
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.log_limits import RateLimit
from ibe_pubsub.peer.tls import PeerTLS

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, bytes], None]
HELLO_TIMEOUT = 5.0
#: Connections from one certified identity a peer keeps at once (a peer needs one per link,
#: two while a duplicate or a renewal settles): more would let any enrolled identity use up
#: a peer's file descriptors. Refused as ``too_many_connections``.
MAX_CONNECTIONS_PER_IDENTITY = 16
#: Incoming connections in their handshake at once; more are refused as ``busy``, so
#: strangers that never finish a handshake cannot hold every descriptor.
MAX_HANDSHAKES = 64
#: Seconds before a failed renewal of a link is tried again (until the link expires).
RENEW_RETRY = 2.0
#: Default seconds between two log lines about refusals of one reason; the others are
#: counted and summed up in the next line, so hostile connections cannot flood the log.
REFUSAL_LOG_INTERVAL = 10.0
DUPLICATE_DRAIN = 2.0
#: Seconds a frame may wait on a connected link before the link holds back its node.
CONGESTED_AFTER = 0.5
#: A link holds back its node no longer than this: a reader whose oldest frame waited this
#: long (it stopped reading, or reads slower than back-pressure can wait for) is slow and is
#: left behind. Longer than a busy but healthy reader pauses on a machine short of cores.
HOLD_LIMIT = 2.0
#: Seconds a frame may wait on a connected link at most: the bound of a link's queueing
#: delay. Older frames are dropped.
MAX_QUEUE_DELAY = 4.0
#: Bytes of kernel buffer each way per connection (0: the kernel's, which grows to tens of
#: megabytes): beyond the send queue, what a reader that stopped still has coming, so part
#: of the delay bound. 256 KiB cost a third of the throughput of a busy root on loopback (a
#: blocked write per frame); a link across a WAN moves at most this much per round trip.
SOCKET_BUFFER = 1 << 20
#: Bytes of queued frames written at once: one write, a few TLS records and one system call
#: for a run of small frames, where a frame each cost a busy root a third of its CPU.
WRITE_BATCH = 64 * 1024
#: Why frames are dropped unsent (:attr:`Transport.dropped_by`).
DROP_REASONS = ("queue_full", "queue_delay", "gave_up")
_END_FRAME = frames.encode(frames.end())

#: OpenSSL verification codes -> refusal reasons. A certificate from another CA fails with
#: "unable to get issuer" (2, 20, 21), as self-signed (18, 19), or, when that CA copies our
#: CA's name, with "certificate signature failure" (7).
_VERIFY_REASONS = {10: "expired", 2: "foreign_ca", 7: "foreign_ca", 18: "foreign_ca",
                   19: "foreign_ca", 20: "foreign_ca", 21: "foreign_ca"}
#: Refusals of a dialed peer's credentials: another attempt within the backoff would meet
#: the same certificate, so the dial stops (the next send dials again).
_FINAL = frozenset({"no_certificate", "foreign_ca", "expired", "bad_certificate",
                    "address_mismatch"})


class TransportError(PeerError):
    """The transport cannot do what was asked (bad address, cannot listen)."""


class _Refused(Exception):
    """A connection refused for ``reason`` (a key of :attr:`Transport.refused`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise TransportError(f"not a HOST:PORT address: {address!r}")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    """(host, port) -> ``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tls_reason(exc: OSError) -> str:
    """The refusal reason for a failed handshake."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _VERIFY_REASONS.get(exc.verify_code, "tls")
    if isinstance(exc, ssl.SSLError) and exc.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return "no_certificate"
    return "tls"


def _certificate_of(tls: PeerTLS, writer: asyncio.StreamWriter) -> PeerCertificate:
    try:
        return tls.remote_certificate(writer.get_extra_info("ssl_object"))
    except PeerCertificateError as exc:
        raise _Refused("bad_certificate", str(exc)) from None


@dataclass(frozen=True)
class Backoff:
    """Redial delays: ``initial * factor**attempt`` capped, times a random factor in
    [1 - jitter, 1 + jitter], for at most ``attempts`` dials per outage."""

    initial: float = 0.1
    factor: float = 2.0
    cap: float = 3.0
    jitter: float = 0.5
    attempts: int = 6

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.cap, self.initial * self.factor ** attempt)
        return base * (1 + self.jitter * (2 * rng.random() - 1))


@dataclass(frozen=True)
class HoldLimits:
    """How much DATA a link keeps while the peer still owes frames on an older connection,
    per connection and for all of the link's connections together. An honest peer's frames
    wait there only until its END crosses the older connection; a certified peer that writes
    on a second connection without ending the first would otherwise grow the buffer at will.
    A frame that does not fit stays unread with everything after it (refused as
    ``held_full``), so TCP slows the sender down and nothing is lost."""

    connection_frames: int = 256
    connection_bytes: int = 1 << 20
    link_frames: int = 1024
    link_bytes: int = 4 << 20


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: Address of the side that dialed ("" for a non-listening dialer).
    dialer: str
    #: The peer's verified certificate (None on a plaintext transport).
    certificate: PeerCertificate | None = None
    #: When the earlier of the two certificates it was made with expires (Unix time).
    expires: float = math.inf
    closing: bool = False
    #: DATA that arrived while the peer still owed frames on an older connection.
    held: list[bytes] = field(default_factory=list)
    held_bytes: int = 0
    #: Not read until the frame in hand fits within the caps, or may be delivered.
    paused: bool = False
    #: The peer sent END: no more DATA comes on this connection.
    ended: bool = False


def _head(queue: deque[tuple[float, bytes]], limit: int) -> list[bytes]:
    """The frames at the head of ``queue`` that fit in ``limit`` bytes (at least one)."""
    batch, size = [], 0
    for _, frame in queue:
        if batch and size + len(frame) > limit:
            break
        batch.append(frame)
        size += len(frame)
    return batch


def _open_gate() -> asyncio.Event:
    gate = asyncio.Event()
    gate.set()
    return gate


@dataclass(eq=False)
class _Link:
    address: str
    #: Frames to send, each with the time it was queued (``time.monotonic()``).
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    conns: list[_Connection] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    #: The connection this side last wrote DATA on.
    sending: _Connection | None = None
    #: The connection the peer writes DATA on, as far as this side has seen.
    receiving: _Connection | None = None
    #: The expiry a renewal was last started for (one renewal at a time per expiry).
    renewed_for: float | None = None
    #: After a failed renewal, not before this (Unix time).
    renew_retry_at: float = 0.0
    #: Renewals in a row that met the other side's expiring certificate (for the backoff).
    renew_early: int = 0
    #: Set when held frames leave or the connection written on changes: paused
    #: connections look again.
    released: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set while the link is read (cleared by :meth:`Transport.pause_reading`).
    reading: asyncio.Event = field(default_factory=_open_gate)
    #: Its reader stalled or fell behind: it holds nothing back until it caught up.
    slow: bool = False
    #: Frames dropped since the peer was last told (a GAP frame).
    gap: int = 0
    #: Frames at the head of the queue being written: sent, so never dropped.
    writing: int = 0
    #: When it last became connected (``time.monotonic()``): frames wait on a connected
    #: link from then at the earliest, so that a dial's time is never held against them.
    connected_at: float = 0.0

    def held(self) -> tuple[int, int]:
        """Frames, and their bytes, that its connections hold."""
        return sum(len(c.held) for c in self.conns), sum(c.held_bytes for c in self.conns)

    def waited(self, index: int, now: float) -> float:
        """Seconds the frame at ``index`` of the queue has waited on a connected link."""
        return now - max(self.queue[index][0], self.connected_at)


class Transport:
    """Moves opaque payloads between peers; ``on_message(sender, payload)`` gets each one.

    ``secure=True`` (the default) authenticates every connection with ``tls``, which may
    be set later (:attr:`tls`); ``secure=False`` with no ``tls`` is plaintext. ``hold`` caps
    the frames kept while a link moves to a newer connection."""

    def __init__(self, on_message: MessageHandler, *, tls: PeerTLS | None = None,
                 secure: bool = True, max_frame: int = frames.DEFAULT_MAX_FRAME,
                 backoff: Backoff | None = None, queue_limit: int = 4096,
                 rng: random.Random | None = None,
                 refusal_log_interval: float = REFUSAL_LOG_INTERVAL,
                 hold: HoldLimits | None = None, socket_buffer: int = SOCKET_BUFFER) -> None:
        if tls is not None and not secure:
            raise TransportError("a plaintext transport takes no TLS credentials")
        self.on_message = on_message
        self.secure = secure
        self._tls = tls
        self.max_frame = max_frame
        self.backoff = backoff or Backoff()
        self.queue_limit = queue_limit
        self.hold = hold or HoldLimits()
        self.socket_buffer = socket_buffer
        self.rng = rng or random.Random()
        #: This peer's dialable address, "" until :meth:`listen` (or for a publisher).
        self.address = ""
        self._links: dict[str, _Link] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Frames dropped unsent, by reason: ``queue_full`` (the oldest, for a newer one),
        #: ``queue_delay`` (waited over MAX_QUEUE_DELAY on a slow link), ``gave_up`` (queued
        #: for a neighbour that could not be reached).
        self.dropped_by: Counter[str] = Counter(dict.fromkeys(DROP_REASONS, 0))
        #: Frames neighbours said (GAP) they dropped for this peer.
        self.missed = 0
        self._drop_log = RateLimit(refusal_log_interval)
        self._handshaking = 0
        #: Connections refused, in either direction, by reason: ``busy``, ``not_ready``,
        #: ``tls``, ``no_certificate``, ``foreign_ca``, ``expired``, ``bad_certificate``,
        #: ``address_mismatch``, ``bad_hello``, ``too_many_connections``; and ``held_full``,
        #: a connection no longer read for a while (see :class:`HoldLimits`).
        self.refused: Counter[str] = Counter()
        self.refusal_log_interval = refusal_log_interval
        self._refusal_logged_at: dict[str, float] = {}
        self._refusals_unlogged: Counter[str] = Counter()
        #: Connections closed because a certificate they were made with expired.
        self.expired_links = 0
        #: Connections replaced ahead of expiry by one made with a renewed certificate.
        self.renewals = 0
        #: DATA frames written to and read from sockets, and their bytes on the wire
        #: (messages a peer sends itself cross no socket and are not counted).
        self.frames_sent = self.bytes_sent = 0
        self.frames_received = self.bytes_received = 0

    # -- public API -------------------------------------------------------------------------

    @property
    def tls(self) -> PeerTLS | None:
        """The credentials new connections use (None: plaintext, or not yet given)."""
        return self._tls

    @tls.setter
    def tls(self, tls: PeerTLS) -> None:
        if not self.secure:
            raise TransportError("a plaintext transport takes no TLS credentials")
        if self.address and not tls.certificate.names(self.address):
            # Every dialer would refuse it: say so now rather than as silent refusals.
            raise TransportError(f"the certificate does not name {self.address}, this "
                                 f"peer's address: {tls.certificate.binding.addresses!r}")
        self._tls = tls
        for link in self._links.values():
            link.wake.set()  # frames queued while waiting for credentials go out now

    async def listen(self, host: str, port: int) -> str:
        """Accept connections on host:port (0 picks a free port); returns the address."""
        try:
            self._server = await asyncio.start_server(self._accepted, host, port)
        except OSError as exc:
            raise TransportError(f"cannot listen on {host}:{port}: {exc}") from exc
        bound = self._server.sockets[0].getsockname()[1]
        self.address = join_address(host, bound)
        return self.address

    async def listen_elsewhere(self, host: str) -> asyncio.Server:
        """Listen on another port of ``host`` that the system picks. The listener until now
        stays bound meanwhile, so the system cannot pick its port again; it is returned, for
        the caller to close once it has no more use for holding its port."""
        held = self._server
        assert held is not None, "listen_elsewhere before listen"
        await self.listen(host, 0)
        return held

    @property
    def dropped(self) -> int:
        """Frames dropped unsent, whatever the reason."""
        return sum(self.dropped_by.values())

    def send(self, to: str, payload: bytes) -> None:
        """Queue one payload for ``to``; dials if needed. Never raises for a dead peer."""
        if self._closed:
            return
        if to == self.address and to:
            # A message to one of this peer's own virtual peers: no socket needed.
            asyncio.get_running_loop().call_soon(self._local, payload)
            return
        try:
            frame = frames.encode(frames.data(payload), self.max_frame)
        except frames.FrameError as exc:
            log.warning("not sending to %s: %s", escape(to), exc)
            return
        link = self._link(to)
        now = time.monotonic()
        if link.queue and link.conns and link.waited(0, now) > MAX_QUEUE_DELAY:
            self._trim(link, now)
        if len(link.queue) >= self.queue_limit and len(link.queue) > link.writing:
            del link.queue[link.writing]
            self._count_drop(link, "queue_full", 1)
        link.queue.append((now, frame))
        link.wake.set()

    def congested(self) -> bool:
        """Whether a connected link that keeps up has had a frame waiting for over
        :data:`CONGESTED_AFTER`: the node should take no more events for a while. Links
        still dialing hold nothing back, nor do slow ones: a
        link whose frame waited over :data:`MAX_QUEUE_DELAY` is made slow here."""
        now = time.monotonic()
        congested = False
        for link in self._links.values():
            if not (link.queue and link.conns):
                continue
            waited = link.waited(0, now)
            if waited > MAX_QUEUE_DELAY:
                self._trim(link, now)
            elif waited <= CONGESTED_AFTER:
                self._caught_up(link)
            elif link.slow:
                continue
            elif waited > HOLD_LIMIT:
                self._slow(link)
            else:
                congested = True
        return congested

    def pause_reading(self, address: str) -> None:
        """Read nothing more from ``address`` until :meth:`resume_reading`: what it sends
        meanwhile waits in its socket and its send queue (TCP back-pressure)."""
        link = self._links.get(address)
        if link is not None:
            link.reading.clear()

    def resume_reading(self, address: str) -> None:
        link = self._links.get(address)
        if link is not None:
            link.reading.set()

    def _trim(self, link: _Link, now: float) -> None:
        """Drop the frames of ``link`` that waited over MAX_QUEUE_DELAY: its reader is slow."""
        dropped, queue = 0, link.queue
        while len(queue) > link.writing and link.waited(link.writing, now) > MAX_QUEUE_DELAY:
            del queue[link.writing]
            dropped += 1
        self._slow(link)
        if dropped:
            self._count_drop(link, "queue_delay", dropped)

    @staticmethod
    def _caught_up(link: _Link) -> None:
        if link.slow:
            link.slow = False
            log.info("%s caught up with its frames", escape(link.address))

    @staticmethod
    def _slow(link: _Link) -> None:
        if not link.slow:
            link.slow = True
            log.warning("%s reads too slowly: no longer waited for; frames waiting over "
                        "%.1f s for it are dropped until it catches up", escape(link.address),
                        MAX_QUEUE_DELAY)

    def _count_drop(self, link: _Link, reason: str, count: int) -> None:
        """Count ``count`` frames dropped for ``link``, to be told to its peer, and log it
        (rate-limited: a line per reason per interval)."""
        self.dropped_by[reason] += count
        link.gap += count
        link.wake.set()  # to tell the gap, even if no frame follows
        held = self._drop_log.allow(reason)
        if held is not None:
            log.warning("dropped %d frame(s) queued for %s (%s)%s", count, escape(link.address),
                        reason, f"; {held} more such drops not logged" if held else "")

    def _local(self, payload: bytes) -> None:
        if self._closed:
            return
        try:
            self.on_message(self.address, payload)
        except Exception:
            log.exception("handler failed on a message to itself")

    def queued(self) -> int:
        """Frames waiting in the send queues."""
        return sum(len(link.queue) for link in self._links.values())

    def is_connected(self, address: str) -> bool:
        link = self._links.get(address)
        return bool(link and any(not c.closing for c in link.conns))

    def peer_certificate(self, address: str) -> PeerCertificate | None:
        """The certificate (binding and expiry) of the live connection to ``address``; None
        if there is none or the transport is plaintext."""
        link = self._links.get(address)
        conn = self._writable(link) if link else None
        return conn.certificate if conn else None

    def maintain(self, now: float, renew_before: float) -> None:
        """Close connections whose certificates expired by ``now`` (Unix time); the next
        send redials with the current certificate. Renew the links this side preferably
        dials whose connection expires within ``renew_before`` seconds, when this side's
        current certificate outlasts it (a fresh connection could not live longer
        otherwise): once per expiry, again after a failed attempt or one that met the
        other side's expiring certificate."""
        tls = self._tls
        if tls is None:
            return
        for link in list(self._links.values()):
            for conn in [c for c in link.conns if c.expires <= now]:
                if not conn.closing:  # a replaced connection still draining is no loss
                    self.expired_links += 1
                    log.info("the connection to %s expired with its certificate; closing",
                             escape(link.address))
                self._drop(link, conn)
                link.wake.set()
            current = self._writable(link)
            if (current is not None and now >= current.expires - renew_before
                    and current.expires < tls.certificate.not_after
                    and link.renewed_for != current.expires and now >= link.renew_retry_at
                    and not link.address.startswith("~")
                    and self._preferred_dialer(link.address) == self.address):
                link.renewed_for = current.expires
                self._spawn(self._renew(link))

    async def flush(self, timeout: float) -> bool:
        """Wait until every queue is written out (or given up); False on timeout."""
        try:
            await asyncio.wait_for(self._flushed(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self, flush_timeout: float = 1.0, linger: float = 2.0) -> None:
        """Flush what is queued (within ``flush_timeout``), then close every connection and
        the listener, waiting up to ``linger`` seconds for the peers to read what was
        written: the kernel still holds it, and a process that exits first resets the
        connections, which discards what a peer (one that paused reading, say) had not yet
        read. A TLS close completes once the peer has read up to it."""
        await self.flush(flush_timeout)
        self._closed = True
        if self._server is not None:
            self._server.close()
        closing = [asyncio.ensure_future(conn.writer.wait_closed())
                   for link in self._links.values() for conn in link.conns]
        for future in closing:
            future.add_done_callback(_take_outcome)
        for link in self._links.values():
            for conn in list(link.conns):
                self._drop(link, conn)
            if link.task is not None:
                link.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *(li.task for li in self._links.values() if li.task),
                             return_exceptions=True)
        if closing:
            await asyncio.wait(closing, timeout=linger)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)

    # -- links and sending --------------------------------------------------------------------

    async def _flushed(self) -> None:
        while any(li.queue for li in self._links.values()):
            await asyncio.sleep(0.02)

    def _link(self, address: str) -> _Link:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = _Link(address)
        if link.task is None or link.task.done():
            link.task = asyncio.get_running_loop().create_task(self._sender(link))
        return link

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _preferred_dialer(self, remote: str) -> str:
        return min(self.address, remote) if self.address and not remote.startswith("~") \
            else self.address

    def _writable(self, link: _Link) -> _Connection | None:
        """The newest live connection dialed by the preferred dialer (else the newest)."""
        live = [c for c in reversed(link.conns) if not c.closing]
        preferred = self._preferred_dialer(link.address)
        return next((c for c in live if c.dialer == preferred), live[0] if live else None)

    async def _sender(self, link: _Link) -> None:
        while not self._closed:
            await link.wake.wait()
            link.wake.clear()
            # A gap alone is told too (its frames were all dropped), on a live connection.
            while (link.queue or (link.gap and self._writable(link))) and not self._closed:
                if self.secure and self._tls is None:
                    break  # kept queued: setting the credentials wakes the link
                now, conn = time.monotonic(), self._writable(link)
                if link.queue and conn and link.waited(0, now) > MAX_QUEUE_DELAY:
                    self._trim(link, now)  # written late is not written: dropped and told
                conn = conn or await self._dial(link)
                if conn is None:
                    if link.queue:
                        log.warning("gave up on %s: dropped %d queued frame(s)",
                                    escape(link.address), len(link.queue))
                        self._count_drop(link, "gave_up", len(link.queue))
                        link.queue.clear()
                    break
                if link.sending is not conn and link.sending in link.conns:
                    assert link.sending is not None
                    link.sending.writer.write(_END_FRAME)  # after its last DATA, in order
                link.sending = conn
                told = min(link.gap, frames.MAX_GAP)
                if told:  # the peer learns what it missed before what comes next
                    link.gap -= told
                    conn.writer.write(frames.encode(frames.gap(told)))
                batch = _head(link.queue, WRITE_BATCH)
                link.writing = len(batch)
                try:
                    conn.writer.write(b"".join(batch))
                    await conn.writer.drain()
                except (ConnectionError, OSError) as exc:
                    log.info("connection to %s broke: %s", escape(link.address),
                             escape(str(exc)))
                    link.gap += told  # told again on the next connection: rather twice
                    self._drop(link, conn)
                    continue
                finally:
                    link.writing = 0
                for _ in batch:
                    link.queue.popleft()
                if not link.queue:
                    self._caught_up(link)
                self.frames_sent += len(batch)
                self.bytes_sent += sum(map(len, batch))

    async def _dial(self, link: _Link) -> _Connection | None:
        if link.address.startswith("~"):
            return None  # a non-listening peer that has hung up cannot be called back
        for attempt in range(self.backoff.attempts):
            if attempt:
                await asyncio.sleep(self.backoff.delay(attempt - 1, self.rng))
            if self._closed:
                return None
            if (existing := self._writable(link)) is not None:
                return existing  # the neighbour dialed us meanwhile
            try:
                conn = await self._connect(link)
            except TransportError as exc:
                log.warning("%s", exc)
                return None
            except _Refused as refusal:
                self._count_refusal(refusal, f"to {link.address}")
                if refusal.reason in _FINAL:
                    return None
                continue
            except (OSError, TimeoutError) as exc:
                log.info("dial %s (attempt %d) failed: %s", escape(link.address), attempt + 1,
                         escape(str(exc)))
                continue
            self._attach(link, conn)
            return conn
        return None

    async def _renew(self, link: _Link) -> None:
        """Make-before-break: a fresh connection with the current certificate becomes the
        link's writable one; the old one drains like a duplicate. A failed attempt (a busy
        peer that did not finish the handshake in time), or one that lives no longer (the
        other side still presented the certificate that expires, not having fetched its
        next one yet, as after a rollover both sides missed), is retried until the link
        expires."""
        renewing = link.renewed_for
        try:
            conn = await self._connect(link)
        except (_Refused, OSError, TimeoutError, TransportError) as exc:
            if isinstance(exc, _Refused):
                self._count_refusal(exc, f"to {link.address}")
            else:
                log.info("renewing the link to %s failed: %s", escape(link.address),
                         escape(str(exc)))
            link.renewed_for, link.renew_retry_at = None, time.time() + RENEW_RETRY
            return
        self.renewals += 1
        self._attach(link, conn)  # make-before-break, even if it lives no longer
        if renewing is not None and conn.expires <= renewing:
            # The other side presented the certificate that expires: it has not fetched
            # its next one yet. Ask again later, backing off (2, 4, 8 ... up to 30 s).
            link.renew_early += 1
            link.renewed_for = None
            link.renew_retry_at = time.time() + min(
                RENEW_RETRY * 2 ** (link.renew_early - 1), 30.0)
        else:
            link.renew_early = 0

    async def _connect(self, link: _Link) -> _Connection:
        """One dial: TCP, TLS (the acceptor's certificate must name the address dialed),
        then HELLO both ways. Raises :class:`_Refused`, ``OSError`` or ``TimeoutError``."""
        host, port = split_address(link.address)
        tls = self._tls
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                HELLO_TIMEOUT)
        self._size_buffers(writer)
        try:
            certificate, expires = await self._handshake(tls, writer, server_side=False)
            if certificate is not None and not certificate.names(link.address):
                raise _Refused("address_mismatch",
                               f"its certificate names {certificate.binding.addresses!r}")
            writer.write(frames.encode(frames.hello(self.address)))
            try:
                remote = await asyncio.wait_for(self._read_hello(reader), HELLO_TIMEOUT)
            except ssl.SSLError as exc:  # the acceptor refused this side's certificate
                raise _Refused(_tls_reason(exc), str(exc)) from None
            except (OSError, TimeoutError, asyncio.IncompleteReadError,
                    frames.FrameError) as exc:
                raise _Refused("bad_hello", str(exc) or type(exc).__name__) from None
            if remote != link.address:
                raise _Refused("bad_hello", f"introduced itself as {remote!r}")
            if self._closed:
                raise ConnectionAbortedError("the transport is closed")
        except BaseException:
            _close_quietly(writer)
            raise
        return _Connection(reader, writer, dialer=self.address, certificate=certificate,
                           expires=expires)

    async def _handshake(self, tls: PeerTLS | None, writer: asyncio.StreamWriter, *,
                         server_side: bool) -> tuple[PeerCertificate | None, float]:
        """TLS on an open TCP connection (nothing on a plaintext transport): the peer's
        certificate and the connection's expiry. Raises :class:`_Refused`."""
        if not self.secure:
            return None, math.inf
        if tls is None:
            raise _Refused("not_ready", "no TLS credentials yet")
        own = tls.certificate
        try:
            await writer.start_tls(tls.server_context if server_side else tls.client_context,
                                   ssl_handshake_timeout=HELLO_TIMEOUT)
        except OSError as exc:  # ssl.SSLError, a reset, or the handshake timing out
            raise _Refused(_tls_reason(exc), str(exc) or type(exc).__name__) from None
        certificate = _certificate_of(tls, writer)
        return certificate, min(own.not_after, certificate.not_after)

    def _count_refusal(self, refusal: _Refused, peer: str, what: str = "a connection") -> None:
        """Count and log a refusal; its text quotes what the peer sent, hence escaped."""
        reason = refusal.reason
        self.refused[reason] += 1
        now = time.monotonic()
        if now - self._refusal_logged_at.get(reason, -math.inf) < self.refusal_log_interval:
            self._refusals_unlogged[reason] += 1
            return
        self._refusal_logged_at[reason] = now
        more = self._refusals_unlogged.pop(reason, 0)
        log.warning("refused %s %s (%s): %s%s", what, escape(peer), reason,
                    escape(str(refusal)),
                    f" (and {more} more for this reason since the last such line)" if more
                    else "")

    # -- connections and receiving ----------------------------------------------------------

    async def _read_hello(self, reader: asyncio.StreamReader) -> str:
        frame = await frames.read_frame(reader, self.max_frame)
        if frame.kind != frames.HELLO:
            raise frames.FrameError("the first frame must be HELLO")
        assert isinstance(frame.payload, str)
        return frame.payload

    def _size_buffers(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if self.socket_buffer and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.socket_buffer)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.socket_buffer)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = join_address(*writer.get_extra_info("peername")[:2])
        self._size_buffers(writer)
        if self._handshaking >= MAX_HANDSHAKES:
            self._count_refusal(_Refused("busy", f"{MAX_HANDSHAKES} handshakes under way"),
                                f"from {peer}")
            writer.close()
            return
        self._handshaking += 1
        try:
            certificate, expires, remote = await self._admit(reader, writer)
        except _Refused as refusal:
            self._count_refusal(refusal, f"from {peer}")
            writer.close()
            return
        finally:
            self._handshaking -= 1
        if self._closed:
            writer.close()
            return
        if not remote:
            remote = f"~{peer}"
        self._attach(self._link(remote), _Connection(reader, writer, dialer=remote,
                                                     certificate=certificate, expires=expires))

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> tuple[PeerCertificate | None, float, str]:
        """The acceptor's side of a connection: TLS, the dialer's HELLO (an address its
        certificate names, or none), room for one more connection of its identity, then
        this side's HELLO. Raises :class:`_Refused`."""
        certificate, expires = await self._handshake(self._tls, writer, server_side=True)
        try:
            remote = await asyncio.wait_for(self._read_hello(reader), HELLO_TIMEOUT)
            if remote:
                split_address(remote)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, frames.FrameError,
                TransportError) as exc:
            raise _Refused("bad_hello", str(exc) or type(exc).__name__) from None
        if certificate is not None:
            identity = certificate.binding.identity
            if remote and not certificate.names(remote):
                raise _Refused("address_mismatch", f"it claimed {remote!r} with a certificate "
                               f"of {identity!r} for {certificate.binding.addresses!r}")
            held = sum(1 for link in self._links.values() for c in link.conns
                       if c.certificate is not None and c.certificate.binding.identity == identity)
            if held >= MAX_CONNECTIONS_PER_IDENTITY:
                raise _Refused("too_many_connections",
                               f"{identity!r} already holds {held} connections")
        writer.write(frames.encode(frames.hello(self.address)))
        return certificate, expires, remote

    def _attach(self, link: _Link, conn: _Connection) -> None:
        if self._writable(link) is None:
            link.connected_at = time.monotonic()
        link.conns.append(conn)
        task = asyncio.get_running_loop().create_task(self._receive(link, conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if len([c for c in link.conns if not c.closing]) > 1:
            keep = self._writable(link)
            for other in link.conns:
                if other is not keep and not other.closing:
                    other.closing = True
                    asyncio.get_running_loop().call_later(DUPLICATE_DRAIN, self._drop, link,
                                                          other)
        link.wake.set()

    def _drop(self, link: _Link, conn: _Connection) -> None:
        conn.closing = True
        if conn in link.conns:
            link.conns.remove(conn)
        conn.writer.close()
        if link.receiving is conn:
            self._hand_over(link)
        else:  # it never became the one the peer writes on: late, not lost
            for payload in self._release(link, conn):
                self._deliver(link, payload)

    async def _receive(self, link: _Link, conn: _Connection) -> None:
        try:
            while True:
                if not link.reading.is_set():
                    await link.reading.wait()
                try:
                    frame = await frames.read_frame(conn.reader, self.max_frame)
                except frames.FrameError as exc:
                    log.warning("dropped a frame from %s: %s", escape(link.address),
                                escape(str(exc)))
                    continue
                if frame.kind == frames.HELLO:
                    log.warning("dropped an unexpected HELLO from %s", escape(link.address))
                elif frame.kind == frames.END:
                    self._ended(link, conn)
                elif frame.kind == frames.GAP:
                    assert isinstance(frame.payload, int)
                    self.missed += frame.payload
                    if self._drop_log.allow("missed") is not None:
                        log.warning("%s dropped %d frame(s) queued for this peer (%d so far)",
                                    escape(link.address), frame.payload, self.missed)
                else:
                    assert isinstance(frame.payload, bytes)
                    self.frames_received += 1
                    self.bytes_received += frame.size
                    if not self._arrived(link, conn, frame.payload):
                        await self._paused(link, conn, frame.payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            log.info("connection from %s closed", escape(link.address))
        finally:
            self._drop(link, conn)

    def _arrived(self, link: _Link, conn: _Connection, payload: bytes) -> bool:
        """Deliver DATA, or hold it while the peer still owes frames on an older
        connection (one it wrote on and has not ended); False, doing neither, when holding
        it would pass a cap of :attr:`hold`."""
        if conn.ended:
            log.warning("dropped a frame from %s sent after END", escape(link.address))
            return True
        if conn not in link.conns:  # read after it was dropped: late, not lost
            self._deliver(link, payload)
            return True
        current = link.receiving
        if current is not None and current is not conn and current in link.conns \
                and not current.ended:
            if not self._room(link, conn, len(payload)):
                return False
            conn.held.append(payload)
            conn.held_bytes += len(payload)
            return True
        link.receiving = conn
        self._deliver(link, payload)
        return True

    def _room(self, link: _Link, conn: _Connection, size: int) -> bool:
        """Whether ``conn`` may hold one more frame of ``size`` bytes."""
        hold = self.hold
        link_frames, link_bytes = link.held()
        return (len(conn.held) < hold.connection_frames
                and conn.held_bytes + size <= hold.connection_bytes
                and link_frames < hold.link_frames and link_bytes + size <= hold.link_bytes)

    async def _paused(self, link: _Link, conn: _Connection, payload: bytes) -> None:
        """Back-pressure: read nothing more from ``conn`` until ``payload`` can be held or
        delivered; what the peer writes meanwhile waits in its socket, not in memory."""
        held, size = link.held()
        self._count_refusal(_Refused("held_full", f"the link holds {held} frames ({size} "
                                     "bytes) until an older connection ends; reading paused"),
                            f"from {link.address}", what="to read more")
        conn.paused = True
        try:
            while True:
                link.released.clear()
                await link.released.wait()
                if self._arrived(link, conn, payload):
                    return
        finally:
            conn.paused = False

    def _ended(self, link: _Link, conn: _Connection) -> None:
        conn.ended = True
        if link.receiving is conn:
            self._hand_over(link)

    def _hand_over(self, link: _Link) -> None:
        """The connection the peer wrote on ended or closed: deliver what the peer wrote
        next, connection by connection (those that already ended first; a paused one
        counts as having written)."""
        link.receiving = None
        link.released.set()
        while waiting := [c for c in link.conns if c.held or c.paused]:
            nxt = min(waiting, key=lambda c: not c.ended)
            link.receiving = nxt
            for payload in self._release(link, nxt):
                self._deliver(link, payload)
            if not nxt.ended:
                return
            link.receiving = None

    @staticmethod
    def _release(link: _Link, conn: _Connection) -> list[bytes]:
        """Take what ``conn`` holds; paused connections of ``link`` look again for room."""
        held, conn.held, conn.held_bytes = conn.held, [], 0
        link.released.set()
        return held

    def _deliver(self, link: _Link, payload: bytes) -> None:
        if self._closed:
            return
        try:
            self.on_message(link.address, payload)
        except Exception:
            log.exception("handler failed on a frame from %s", escape(link.address))


def _close_quietly(writer: asyncio.StreamWriter) -> None:
    """Close a connection given up on, and take the error that ended it, if any, once the
    close completes (without waiting for it here): a reset that was the reason to give up
    must not resurface when the process exits, as asyncio's "Future exception was never
    retrieved" with a traceback."""
    writer.close()
    asyncio.ensure_future(writer.wait_closed()).add_done_callback(_take_outcome)


def _take_outcome(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()
