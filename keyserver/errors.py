"""One JSON shape for every error response::

    {"error": {"status": 403, "code": "outside_policy", "message": "...", "detail": ...}}

``detail`` is optional structured data (e.g. the offending policy clause, the
validation errors of a 422).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ibe_pubsub.keyserver.api_models import ErrorOut
from ibe_pubsub.keyserver.exceptions import KeyServerError
from ibe_pubsub.keyserver.refusals import audit_refusal

log = logging.getLogger(__name__)

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 409: "conflict", 413: "body_too_large",
          415: "unsupported_media_type", 422: "invalid", 429: "rate_limited",
          500: "internal_error", 503: "unavailable"}


class ApiError(KeyServerError):
    """Raised by handlers; rendered as the error shape with ``status``."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 detail: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.detail = detail
        self.headers = headers

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        """Pickled with its own arguments, so it crosses a process pool."""
        return type(self), (self.status, self.message, self.code, self.detail, self.headers)


def error_body(status: int, message: str, code: str | None = None,
               detail: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": status, "code": code or _CODES.get(status, "error"),
                            "message": message}
    if detail is not None:
        body["detail"] = detail
    return {"error": body}


def error_response(status: int, message: str, code: str | None = None, detail: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, detail), status_code=status,
                        headers=headers)


def _validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Location, message and type of each problem; never the (possibly huge) input."""
    return [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
             "type": str(e.get("type", ""))} for e in exc.errors()]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        audit_refusal(request.scope, exc.status, exc.code, exc.message)
        return error_response(exc.status, exc.message, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        audit_refusal(request.scope, 422, "invalid", "request does not match the API")
        return error_response(422, "request does not match the API", "invalid",
                              _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else _CODES.get(exc.status_code, "")
        # FastAPI's 400 is a body it cannot read (not UTF-8, nested too deep): a bad body, 422.
        status = 422 if exc.status_code == 400 else exc.status_code
        audit_refusal(request.scope, status, _CODES.get(status, "error"), message)
        return error_response(status, message, headers=getattr(exc, "headers", None))

    app.add_middleware(CatchAll)


class CatchAll:
    """ASGI middleware: any unhandled exception becomes the JSON 500 (logged, no traceback
    in the answer). Not an ``Exception`` handler: Starlette re-raises after those, so
    uvicorn would drop the client's keep-alive connection as well."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if started:
                raise  # half an answer is out: only closing the connection can tell
            await error_response(500, "internal error (logged on the key server)")(
                scope, receive, send)


_MEANINGS = {401: "missing or invalid bearer token",
             403: "identity revoked, wrong role, outside the identity's policy, keys "
             "only through bulk issuance, or a directory tree the caller is not in",
             404: "no such identity", 409: "conflict with the stored state",
             413: "request body too large", 422: "invalid request (body, parameter, "
             "predicate, attribute or key)", 429: "rate limit exceeded (see Retry-After)"}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: the error shape for each of ``statuses`` and for 413
    and 429, which every route can answer (body limit, rate limits)."""
    return {status: {"model": ErrorOut, "description": _MEANINGS[status]}
            for status in sorted({*statuses, 413, 429})}
