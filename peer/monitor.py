"""The peer's local HTTP endpoint (``peer run --http``): ``/healthz``, ``/metrics``, ``/status``.

A tiny ASGI app served by uvicorn as a task of the node's own event loop, so a request
reads the node's state between two of its steps, without locks. The socket is bound here
(a bind failure is a :class:`MonitorError`, not uvicorn's exit), and uvicorn is kept from
installing signal handlers: the peer's own handle SIGINT and SIGTERM. A request the app
cannot serve gets a JSON error, never a crashed peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from peer.transport import TransportError, join_address, split_address

log = logging.getLogger(__name__)

#: The default host of ``--http PORT``: the endpoint shows the peer's links, keep it local.
DEFAULT_HOST = "127.0.0.1"
Handler = Callable[[], tuple[int, str, bytes]]


class MonitorError(Exception):
    """The endpoint cannot listen where asked."""


def parse_http(text: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (host defaults to loopback) -> (host, port)."""
    spec = str(text).strip()
    if spec.isdigit():
        spec = f"{DEFAULT_HOST}:{spec}"
    try:
        return split_address(spec)
    except TransportError as exc:
        raise ValueError(f"expected PORT or HOST:PORT, got {text!r}") from exc


def json_body(status: int, doc: Any) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(doc, sort_keys=True).encode()


def asgi_app(routes: dict[str, Handler]) -> Callable[..., Awaitable[None]]:
    """An ASGI app answering GET (and HEAD) on ``routes``; 404/405 JSON otherwise."""

    async def app(scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                  send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        handler = routes.get(scope["path"])
        if handler is None:
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


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The peer handles signals itself."""
        yield


class Monitor:
    """Serves ``routes`` at host:port on the running loop, from :meth:`start` to :meth:`stop`."""

    def __init__(self, host: str, port: int, routes: dict[str, Handler]) -> None:
        self.host, self.port = host, port
        self.server = _Server(uvicorn.Config(
            asgi_app(routes), lifespan="off", access_log=False, log_config=None,
            log_level=None, http="h11", server_header=False))
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{join_address(self.host, self.port)}"

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise MonitorError(f"cannot listen on {join_address(self.host, self.port)}: "
                               f"{exc.strerror or exc}") from exc
        self.port = sock.getsockname()[1]
        self._task = asyncio.get_running_loop().create_task(self.server.serve([sock]))

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self._task, timeout=2.0)
