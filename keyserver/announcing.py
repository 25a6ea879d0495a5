"""uvicorn adapted to the key server: its server announcing when it listens, and its h11
protocol applying the connection limits (``keyserver.connections``). ``keyserver.server``
imports it (and the rest of the web stack) only once the start-up checks have passed."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
from collections.abc import Callable
from typing import ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ibe_pubsub.keyserver.connections import ConnectionGate, address_key
from ibe_pubsub.keyserver.errors import error_body

log = logging.getLogger(__name__)


def worth_logging(count: int) -> bool:
    """Log the 1st, 2nd, 4th, 8th, ... event of a kind a stranger can cause at will, so a
    flood of them writes a few lines, not one each."""
    return count & (count - 1) == 0


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, calling ``on_ready(url)`` once its socket listens (so a client
    connecting from then on is served), e.g. to write ``--ready-file``."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.config.host, self.servers[0].sockets[0].getsockname()[1]
            scheme = "https" if self.config.is_ssl else "http"
            self._on_ready(f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}")


def refusal(message: str, retry_after: float) -> bytes:
    """A whole 503 answer in the API's error shape, written before any request was read
    (h11 answers only requests), then the connection is closed."""
    body = json.dumps(error_body(503, message, "too_many_connections")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nretry-after: %d\r\nconnection: close\r\n\r\n%s"
            % (len(body), max(1, math.ceil(retry_after)), body))


class GatedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :attr:`gate`'s limits: a connection beyond a cap gets a
    503 and is closed at once, so its file descriptor is free again; one that has not sent a
    complete request head ``head_timeout`` seconds after it opened or after its previous
    answer is closed. uvicorn's own keep-alive timer stops at the first byte, and h11 has
    none for the head. Use :func:`gated_protocol` for a class with a gate."""

    gate: ClassVar[ConnectionGate]
    _key: str | None = None  # the address key the gate counts this connection under
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        key = address_key(self.client[0] if self.client else "")
        refused = self.gate.admit(key)
        if refused is not None:
            if worth_logging(self.gate.refused):
                log.warning("connection refused (%d so far): %s", self.gate.refused, refused)
            transport.write(refusal(f"too many connections: {refused}",
                                    self.gate.limits.head_timeout))
            transport.close()
            return
        self._key = key
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._key is not None:
            self.gate.release(self._key)
            self._key = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
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


def gated_protocol(gate: ConnectionGate) -> type[GatedH11Protocol]:
    """A protocol class for uvicorn's ``http=`` whose connections share ``gate``."""
    return type("GatedH11Protocol", (GatedH11Protocol,), {"gate": gate})
