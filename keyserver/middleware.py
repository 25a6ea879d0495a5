"""ASGI middleware: the gate in front of every request, and request metrics."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ibe_pubsub.keyserver.auth import Need, authenticate, check_address
from ibe_pubsub.keyserver.errors import ApiError, error_body
from ibe_pubsub.keyserver.metrics import Metrics
from ibe_pubsub.keyserver.refusals import audit_refusal
from ibe_pubsub.keyserver.state import AppState

KIB = 1024


@dataclass(frozen=True)
class RouteRule:
    """What the routes under ``prefix`` need: a token (None: public) and at most
    ``max_body`` bytes of body."""

    prefix: str
    need: Need | None
    max_body: int

    def matches(self, path: str) -> bool:
        return not self.prefix or path == self.prefix or path.startswith(self.prefix + "/")


def route_rules(bulk_max_body: int) -> tuple[RouteRule, ...]:
    """Most specific first; the last one (public, small bodies) matches every path.
    Identity and enrolment bodies are a name, a policy or a predicate: kilobytes."""
    return (RouteRule("/v1/admin/bulk", "admin", bulk_max_body),
            RouteRule("/v1/admin", "admin", 64 * KIB),
            RouteRule("/v1/enrol", "identity", 64 * KIB),
            RouteRule("/v3/enrol", "identity", 64 * KIB),
            RouteRule("/v1/directory", "any", 8 * KIB),
            RouteRule("", None, 4 * KIB))


async def _refuse(scope: Scope, send: Send, error: ApiError) -> None:
    """Audit the refusal, then answer it and close the connection (its body is unread)."""
    audit_refusal(scope, error.status, error.code, error.message)
    body = json.dumps(error_body(error.status, error.message, error.code)).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(scope: Scope, receive: Receive, limit: int) -> Receive:
    """Read the body chunk by chunk, never more than ``limit`` bytes (413 beyond, before
    reading anything if the declared length is larger), and replay it to the app."""
    too_big = ApiError(413, f"request body exceeds {limit} bytes for this route")
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and (not value.isdigit() or int(value) > limit):
            raise too_big
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
        more = message.get("more_body", False)
    body, replayed = b"".join(chunks), False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class Gate:
    """Before any byte of a request's body is read: the client-address limit, then the
    token its route needs (``keyserver.auth``); then the body, up to the route's limit.
    Each refusal is audited and answered here, so a caller without a valid token can
    make the server hold no more than the headers of its request."""

    def __init__(self, app: ASGIApp, state: AppState, rules: Sequence[RouteRule]) -> None:
        self.app, self.state, self.rules = app, state, rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = next(r for r in self.rules if r.matches(scope["path"]))
        try:
            check_address(self.state, scope)
            if rule.need is not None:
                await authenticate(self.state, scope, rule.need)
            receive = await _read_body(scope, receive, rule.max_body)
        except ApiError as error:
            await _refuse(scope, send, error)
            return
        await self.app(scope, receive, send)


class RequestMetrics:
    """Counts requests by route template and status, and times them."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics
        self._templates: list[tuple[re.Pattern[str], str, set[str]]] | None = None

    def _route_name(self, scope: Scope) -> str:
        """The template of the route the request was routed to or, if the gate refused it
        before routing, of the API path it was meant for (from the OpenAPI document; by
        method too, as ``GET /v1/directory/{attribute}`` and ``DELETE
        /v1/directory/{address}`` share their shape)."""
        route = scope.get("route")
        if route is not None:
            return getattr(route, "path", None) or "unmatched"
        if self._templates is None:
            self._templates = [(compile_path(t)[0], t, set(operations)) for t, operations
                               in scope["app"].openapi()["paths"].items()]
        method = scope["method"].lower()
        return next((t for regex, t, methods in self._templates
                     if method in methods and regex.match(scope["path"])), "unmatched")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self.metrics.observe_request(scope["method"], self._route_name(scope), status,
                                         time.perf_counter() - start)
