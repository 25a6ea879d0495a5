"""uvicorn adapted to the key server: its server announcing when it listens, and its h11
protocol applying the connection limits (``keyserver.connections``) and, with TLS, doing
the handshake within them. ``keyserver.server``
imports it (and the rest of the web stack) only once the start-up checks have passed."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import ClassVar, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from ibe_pubsub.keyserver.connections import ConnectionGate, address_key
from ibe_pubsub.keyserver.errors import error_body

log = logging.getLogger(__name__)


def worth_logging(count: int) -> bool:
    """Log the 1st, 2nd, 4th, 8th, ... event of a kind a stranger can cause at will, so a
    flood of them writes a few lines, not one each."""
    return count & (count - 1) == 0


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, calling ``on_ready(url)`` once its socket listens (so a client
    connecting from then on is served), e.g. to write ``--ready-file``. ``tls``: its
    protocol serves HTTPS (:func:`gated_protocol`), which uvicorn's settings do not show."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None],
                 tls: bool = False) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._scheme = "https" if tls else "http"

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_ready(self._url(self.servers[0].sockets[0]))

    def _log_started_message(self, listeners: Sequence[socket.socket]) -> None:
        """uvicorn's line, with the right scheme: uvicorn's says http when the protocol
        does the TLS handshake."""
        logging.getLogger("uvicorn.error").info("Uvicorn running on %s (Press CTRL+C to quit)",
                                                self._url(listeners[0]))

    def _url(self, listener: socket.socket) -> str:
        host, port = self.config.host, listener.getsockname()[1]
        return f"{self._scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def refusal(message: str, retry_after: float) -> bytes:
    """A whole 503 answer in the API's error shape, written before any request was read
    (h11 answers only requests), then the connection is closed."""
    body = json.dumps(error_body(503, message, "too_many_connections")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nretry-after: %d\r\nconnection: close\r\n\r\n%s"
            % (len(body), max(1, math.ceil(retry_after)), body))


class GatedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :attr:`gate`'s limits: a connection beyond a cap is
    closed at once (after a 503 on plain HTTP), so its file descriptor is free again; one
    that has not sent a complete request head ``head_timeout`` seconds after it opened or
    after its previous answer is closed. uvicorn's own keep-alive timer stops at the first
    byte, and h11 has none for the head.

    With :attr:`tls`, the protocol gets the plain TCP connection and does the handshake
    itself (``loop.start_tls``): asyncio would call ``connection_made`` only once the
    handshake is over, so a client never finishing it would be neither counted nor timed.
    The head timeout then runs from the TCP connection's opening, handshake included. Use
    :func:`gated_protocol` for a class with a gate."""

    gate: ClassVar[ConnectionGate]
    tls: ClassVar[ssl.SSLContext | None] = None
    _key: str | None = None  # the address key the gate counts this connection under
    _head_timer: asyncio.TimerHandle | None = None
    # Over TLS, bytes received before the TLS transport is in place: until start_tls takes
    # over, the client's first TLS bytes (uvloop reads as soon as connection_made returns),
    # for the TLS layer; then what the TLS layer decrypts before start_tls returns (sent with
    # the handshake's last flight), for h11.
    _pending: bytearray | None = None
    _upgrading: asyncio.Task[None] | None = None  # the loop keeps tasks weakly only

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.tls is None:
            super().connection_made(transport)
        else:
            self.transport = transport  # the TCP one until the handshake is over
        client = get_remote_addr(transport)
        key = address_key(client[0] if client else "")
        refused = self.gate.admit(key)
        if refused is not None:
            if worth_logging(self.gate.refused):
                log.warning("connection refused (%d so far): %s", self.gate.refused, refused)
            if self.tls is None:  # over TLS, nothing can be said before the handshake
                transport.write(refusal(f"too many connections: {refused}",
                                        self.gate.limits.head_timeout))
            transport.close()
            return
        self._key = key
        self._watch_head()
        if self.tls is not None:
            self._pending = bytearray()
            self._upgrading = self.loop.create_task(self._upgrade(transport, self.tls))

    async def _upgrade(self, transport: asyncio.Transport, tls: ssl.SSLContext) -> None:
        """Do the TLS handshake, then serve HTTP on the TLS transport; or give the
        connection's place back if the handshake failed or the head timer closed it."""
        # Runs once start_tls has put the TLS layer in place, before that layer reads.
        self.loop.call_soon(self._hand_over, transport)
        try:
            secure = await self.loop.start_tls(transport, self, tls, server_side=True)
        except OSError:  # a TLS error or a reset: start_tls has closed the socket
            secure = None
        except BaseException:  # e.g. cancelled at shutdown
            self._release()
            raise
        if secure is None or secure.is_closing():
            self._release()
            return
        super().connection_made(secure)
        early, self._pending = bytes(self._pending or b""), None
        if early:
            self.data_received(early)

    def _hand_over(self, transport: asyncio.Transport) -> None:
        """Give the TLS layer the bytes read before it took over, as if it had read them."""
        raw, self._pending = memoryview(bytes(self._pending or b"")), bytearray()
        layer = cast(asyncio.BufferedProtocol, transport.get_protocol())  # asyncio's, uvloop's
        while raw and layer is not self:
            buffer = memoryview(layer.get_buffer(len(raw)))
            size = min(len(buffer), len(raw))
            buffer[:size] = raw[:size]
            layer.buffer_updated(size)
            raw = raw[size:]

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        """Stop the head timer and give the gate this connection's place back, once: a TLS
        connection failing its handshake may or may not see ``connection_lost``."""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._key is not None:
            self.gate.release(self._key)
            self._key = None

    def data_received(self, data: bytes) -> None:
        if self._pending is not None:
            self._pending += data
            return
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def _watch_head(self) -> None:
        """Run the head timer while the connection waits for a request head (h11's IDLE),
        from when it began waiting: bytes arriving do not restart it."""
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        elif waiting and self._head_timer is None and self.gate.limits.head_timeout:
            self._head_timer = self.loop.call_later(self.gate.limits.head_timeout,
                                                    self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.gate.timed_out += 1
            if worth_logging(self.gate.timed_out):
                log.warning("connection closed without a complete request head within %s s "
                            "(%d so far)", self.gate.limits.head_timeout, self.gate.timed_out)
            self.timeout_keep_alive_handler()  # closes it as an idle keep-alive


def gated_protocol(gate: ConnectionGate, tls: ssl.SSLContext | None = None
                   ) -> type[GatedH11Protocol]:
    """A protocol class for uvicorn's ``http=`` whose connections share ``gate``, serving
    HTTPS with ``tls`` (then uvicorn must not be given TLS settings of its own)."""
    return type("GatedH11Protocol", (GatedH11Protocol,), {"gate": gate, "tls": tls})
