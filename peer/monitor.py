"""The peer's local HTTP endpoint (``peer run --http``): ``/healthz``, ``/metrics``, ``/status``.

A tiny ASGI app served by uvicorn as a task of the node's own event loop, so a request
reads the node's state between two of its steps, without locks. The socket is bound here
(a bind failure is a :class:`MonitorError`, not uvicorn's exit), and uvicorn is kept from
installing signal handlers: the peer's own handle SIGINT and SIGTERM. A request the app
cannot serve gets a JSON error, never a crashed peer.

Whoever can connect must not be able to starve the peer: at most :data:`MAX_CONNECTIONS`
connections are open at once (more are closed on arrival, before they hold a file
descriptor the overlay needs), each must send a whole request within
:data:`REQUEST_TIMEOUT` seconds of opening or of the previous response, and uvicorn's
lines about bad requests are rate-limited. Nor can one client starve the others: a client
address (an IPv6 client's /64) holds at most :data:`MAX_CONNECTIONS_PER_ADDRESS` of the
slots, so a scraper at another address finds one free unless clients at
``MAX_CONNECTIONS // MAX_CONNECTIONS_PER_ADDRESS`` other addresses fill them together.
A Host header that names neither an IP address, ``localhost``, the bound host nor an
allowed name is refused (421), so a web page whose DNS name is rebound to this machine
cannot read ``/status`` through a browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Collection, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ibe_pubsub.credentials import is_unspecified
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.log_limits import RateLimit
from ibe_pubsub.peer.transport import TransportError, join_address, split_address

log = logging.getLogger(__name__)

#: The default host of ``--http PORT``: the endpoint shows the peer's links, keep it local.
DEFAULT_HOST = "127.0.0.1"
#: Connections open at once; a scraper needs one or two.
MAX_CONNECTIONS = 64
#: Connections open at once from one client address (an IPv6 client's /64, which one host
#: usually holds whole): a client holding and reopening half-sent requests takes no more.
MAX_CONNECTIONS_PER_ADDRESS = 8
#: Seconds a connection has for a whole request, from its opening or the last response.
REQUEST_TIMEOUT = 5.0
Handler = Callable[[], tuple[int, str, bytes]]


class MonitorError(PeerError):
    """The endpoint cannot listen where asked."""


class HttpAddressError(PeerError, ValueError):
    """An ``--http`` address that is neither ``PORT`` nor ``HOST:PORT``."""


def parse_http(text: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (host defaults to loopback) -> (host, port)."""
    spec = str(text).strip()
    if spec.isdigit():
        spec = f"{DEFAULT_HOST}:{spec}"
    try:
        return split_address(spec)
    except TransportError as exc:
        raise HttpAddressError(f"expected PORT or HOST:PORT, got {text!r}") from exc


def json_body(status: int, doc: Any) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(doc, sort_keys=True).encode()


def host_allowed(header: bytes | None, names: Collection[str]) -> bool:
    """Whether a request's Host header (port, if any, aside) is an IP address or in
    ``names``. No header at all (HTTP/1.0) is allowed: browsers always send one."""
    if header is None:
        return True
    host = header.decode("latin-1").strip().lower()
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    else:
        name = host if host.count(":") > 1 else host.partition(":")[0]
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name in names
    return True


def asgi_app(routes: dict[str, Handler], hosts: Collection[str]
             ) -> Callable[..., Awaitable[None]]:
    """An ASGI app answering GET (and HEAD) on ``routes`` for requests whose Host is an IP
    address or one of ``hosts``; 421/404/405 JSON otherwise, and websockets refused."""

    async def app(scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                  send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # HTTP 403
            return
        host = dict(scope["headers"]).get(b"host")
        handler = routes.get(scope["path"])
        if not host_allowed(host, hosts):
            status, kind, body = json_body(421, {
                "error": f"not served to Host {host.decode('latin-1')!r}: use an IP address, "
                         "localhost or a name allowed with --http-allowed-hosts"})
        elif handler is None:
            status, kind, body = json_body(404, {"error": "not found",
                                                 "paths": sorted(routes)})
        elif scope["method"] not in ("GET", "HEAD"):
            status, kind, body = json_body(405, {"error": "only GET"})
        else:
            try:
                status, kind, body = handler()
            except Exception:
                log.exception("the monitoring endpoint failed on %s", scope["path"])
                status, kind, body = json_body(500, {"error": "internal error"})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else body})

    return app


class _DeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has not completed a request
    :data:`REQUEST_TIMEOUT` seconds after it opened or after the previous response."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        """(Re)start the deadline; it also ends a websocket upgraded from this connection."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(REQUEST_TIMEOUT, self.transport.abort)


@functools.lru_cache(maxsize=1024)
def client_group(host: str) -> str:
    """The share of slots a client counts against: its IPv4 address (also when mapped into
    IPv6), or its IPv6 /64, so that a host cannot take more by changing its interface id."""
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address.packed[:8] + bytes(8), 64)))
    return str(address)


def _rate_limit(logger: logging.Logger) -> None:
    if not any(isinstance(f, RateLimit) for f in logger.filters):
        logger.addFilter(RateLimit())


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The peer handles signals itself."""
        yield


class Monitor:
    """Serves ``routes`` at host:port on the running loop, from :meth:`start` to :meth:`stop`.

    Connections are accepted here, one at a time, rather than by uvicorn's asyncio server,
    which accepts a whole backlog in one go and so holds a descriptor for every waiting
    connection before any protocol could refuse it. A connection beyond the cap, or beyond
    its address's share, is closed right after ``accept``, so the endpoint never holds more
    than the cap plus one."""

    def __init__(self, host: str, port: int, routes: dict[str, Handler],
                 allowed_hosts: Collection[str] = ()) -> None:
        self.host, self.port = host, port
        hosts = {"localhost", host.lower(), *(name.lower() for name in allowed_hosts)}
        self.server = _Server(uvicorn.Config(
            asgi_app(routes, frozenset(hosts)), lifespan="off", access_log=False,
            log_config=None, log_level=None, http=_DeadlineProtocol, server_header=False))
        self._tasks: list[asyncio.Task[None]] = []
        self._socket: socket.socket | None = None
        for logger in (log, logging.getLogger("uvicorn.error")):
            _rate_limit(logger)

    @property
    def url(self) -> str:
        """Where to connect: loopback for a wildcard bind (``0.0.0.0``, ``::``)."""
        host = self.host
        if is_unspecified(host):
            host = "::1" if ":" in host else "127.0.0.1"
        return f"http://{join_address(host, self.port)}"

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(MAX_CONNECTIONS)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise MonitorError(f"cannot listen on {join_address(self.host, self.port)}: "
                               f"{exc.strerror or exc}") from exc
        self.port, self._socket = sock.getsockname()[1], sock
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.server.serve([])),  # no listener of its own
                       loop.create_task(self._accept(sock))]

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        state = self.server.server_state
        protocol = functools.partial(_DeadlineProtocol, config=self.server.config,
                                     server_state=state, app_state={})
        while True:
            try:
                connection, client = await loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors: wait rather than spin
                log.warning("the monitoring endpoint cannot accept: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if len(state.connections) >= MAX_CONNECTIONS:
                connection.close()
                log.warning("closed monitoring connections beyond %d open at once",
                            MAX_CONNECTIONS)
                continue
            group = client_group(client[0])
            if sum(1 for p in state.connections if p.client is not None
                   and client_group(p.client[0]) == group) >= MAX_CONNECTIONS_PER_ADDRESS:
                connection.close()
                log.warning("closed monitoring connections beyond %d open at once from "
                            "one address", MAX_CONNECTIONS_PER_ADDRESS)
                continue
            await loop.connect_accepted_socket(protocol, connection)

    async def stop(self) -> None:
        if not self._tasks:
            return
        serving, accepting = self._tasks
        accepting.cancel()
        if self._socket is not None:
            self._socket.close()
        self.server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(serving, timeout=2.0)
