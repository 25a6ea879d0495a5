"""Asyncio TCP transport: one logical link per neighbour address, frames in and out.

The overlay names peers by their dialable address ``host:port``. A link dials on
the first send, redials with exponential backoff and jitter when the connection
drops, and gives up (dropping what was queued, with a log line) after a bounded
number of attempts: the overlay's heartbeats decide whether a neighbour is gone.
When two peers dial each other at once, both keep writing on the connection dialed
by the smaller address and close the other after a short drain, so each pair
settles on one connection. A message to the peer's own address is handed back to it
without a socket. A peer that does not listen (a publisher) says hello
with an empty address and is named ``~host:port`` by the other side; it can be
answered while connected but never dialed. TLS is used when ssl contexts are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from peer import frames

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, bytes], None]
HELLO_TIMEOUT = 5.0
DUPLICATE_DRAIN = 2.0


class TransportError(Exception):
    """The transport cannot do what was asked (bad address, cannot listen)."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise TransportError(f"not a HOST:PORT address: {address!r}")
    return host.strip("[]"), int(port)


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


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: Address of the side that dialed ("" for a non-listening dialer).
    dialer: str
    closing: bool = False


@dataclass(eq=False)
class _Link:
    address: str
    queue: deque[bytes] = field(default_factory=deque)
    conns: list[_Connection] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Transport:
    """Moves opaque payloads between peers; ``on_message(sender, payload)`` gets each one."""

    def __init__(self, on_message: MessageHandler, *, max_frame: int = frames.DEFAULT_MAX_FRAME,
                 backoff: Backoff | None = None, ssl_server: ssl.SSLContext | None = None,
                 ssl_client: ssl.SSLContext | None = None, queue_limit: int = 4096,
                 rng: random.Random | None = None) -> None:
        self.on_message = on_message
        self.max_frame = max_frame
        self.backoff = backoff or Backoff()
        self.ssl_server = ssl_server
        self.ssl_client = ssl_client
        self.queue_limit = queue_limit
        self.rng = rng or random.Random()
        #: This peer's dialable address, "" until :meth:`listen` (or for a publisher).
        self.address = ""
        self._links: dict[str, _Link] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Frames dropped unsent (queue overflow, or a neighbour given up on).
        self.dropped = 0

    # -- public API -------------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> str:
        """Accept connections on host:port (0 picks a free port); returns the address."""
        try:
            self._server = await asyncio.start_server(self._accepted, host, port,
                                                      ssl=self.ssl_server)
        except OSError as exc:
            raise TransportError(f"cannot listen on {host}:{port}: {exc}") from exc
        bound = self._server.sockets[0].getsockname()[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        return self.address

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
            log.warning("not sending to %s: %s", to, exc)
            return
        link = self._link(to)
        if len(link.queue) >= self.queue_limit:
            link.queue.popleft()
            self.dropped += 1
            log.warning("send queue to %s is full: dropped the oldest frame", to)
        link.queue.append(frame)
        link.wake.set()

    def _local(self, payload: bytes) -> None:
        if self._closed:
            return
        try:
            self.on_message(self.address, payload)
        except Exception:
            log.exception("handler failed on a message to itself")

    def is_connected(self, address: str) -> bool:
        link = self._links.get(address)
        return bool(link and any(not c.closing for c in link.conns))

    async def flush(self, timeout: float) -> bool:
        """Wait until every queue is written out (or given up); False on timeout."""
        try:
            await asyncio.wait_for(self._flushed(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self, flush_timeout: float = 1.0) -> None:
        """Flush what is queued (within ``flush_timeout``), then close every connection and
        the listener."""
        await self.flush(flush_timeout)
        self._closed = True
        if self._server is not None:
            self._server.close()
        for link in self._links.values():
            for conn in list(link.conns):
                self._drop(link, conn)
            if link.task is not None:
                link.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *(li.task for li in self._links.values() if li.task),
                             return_exceptions=True)
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

    def _preferred_dialer(self, remote: str) -> str:
        return min(self.address, remote) if self.address and not remote.startswith("~") \
            else self.address

    def _writable(self, link: _Link) -> _Connection | None:
        live = [c for c in link.conns if not c.closing]
        preferred = self._preferred_dialer(link.address)
        return next((c for c in live if c.dialer == preferred), live[0] if live else None)

    async def _sender(self, link: _Link) -> None:
        while not self._closed:
            await link.wake.wait()
            link.wake.clear()
            while link.queue and not self._closed:
                conn = self._writable(link) or await self._dial(link)
                if conn is None:
                    log.warning("gave up on %s: dropped %d queued frame(s)", link.address,
                                len(link.queue))
                    self.dropped += len(link.queue)
                    link.queue.clear()
                    break
                frame = link.queue[0]
                try:
                    conn.writer.write(frame)
                    await conn.writer.drain()
                except (ConnectionError, OSError) as exc:
                    log.info("connection to %s broke: %s", link.address, exc)
                    self._drop(link, conn)
                    continue
                link.queue.popleft()

    async def _dial(self, link: _Link) -> _Connection | None:
        if link.address.startswith("~"):
            return None  # a non-listening peer that has hung up cannot be called back
        try:
            host, port = split_address(link.address)
        except TransportError as exc:
            log.warning("%s", exc)
            return None
        for attempt in range(self.backoff.attempts):
            if attempt:
                await asyncio.sleep(self.backoff.delay(attempt - 1, self.rng))
            if self._closed:
                return None
            if (existing := self._writable(link)) is not None:
                return existing  # the neighbour dialed us meanwhile
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=self.ssl_client), HELLO_TIMEOUT)
                writer.write(frames.encode(frames.hello(self.address)))
                remote = await asyncio.wait_for(self._read_hello(reader), HELLO_TIMEOUT)
            except (OSError, TimeoutError, asyncio.IncompleteReadError,
                    frames.FrameError, ssl.SSLError) as exc:
                log.info("dial %s (attempt %d) failed: %s", link.address, attempt + 1, exc)
                continue
            if remote != link.address:
                log.warning("%s introduced itself as %r; closing", link.address, remote)
                writer.close()
                continue
            conn = _Connection(reader, writer, dialer=self.address)
            self._attach(link, conn)
            return conn
        return None

    # -- connections and receiving ----------------------------------------------------------

    async def _read_hello(self, reader: asyncio.StreamReader) -> str:
        frame = await frames.read_frame(reader, self.max_frame)
        if frame.kind != frames.HELLO:
            raise frames.FrameError("the first frame must be HELLO")
        assert isinstance(frame.payload, str)
        return frame.payload

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            remote = await asyncio.wait_for(self._read_hello(reader), HELLO_TIMEOUT)
            if remote:
                split_address(remote)
            writer.write(frames.encode(frames.hello(self.address)))
        except (OSError, TimeoutError, asyncio.IncompleteReadError, frames.FrameError,
                TransportError, ssl.SSLError) as exc:
            log.warning("refused a connection from %s: %s",
                        writer.get_extra_info("peername"), exc)
            writer.close()
            return
        if not remote:
            host, port = writer.get_extra_info("peername")[:2]
            remote = f"~{host}:{port}"
        self._attach(self._link(remote), _Connection(reader, writer, dialer=remote))

    def _attach(self, link: _Link, conn: _Connection) -> None:
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

    async def _receive(self, link: _Link, conn: _Connection) -> None:
        try:
            while True:
                try:
                    frame = await frames.read_frame(conn.reader, self.max_frame)
                except frames.FrameError as exc:
                    log.warning("dropped a frame from %s: %s", link.address, exc)
                    continue
                if frame.kind != frames.DATA:
                    log.warning("dropped an unexpected HELLO from %s", link.address)
                    continue
                assert isinstance(frame.payload, bytes)
                try:
                    self.on_message(link.address, frame.payload)
                except Exception:
                    log.exception("handler failed on a frame from %s", link.address)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
            log.info("connection from %s closed", link.address)
        finally:
            self._drop(link, conn)
