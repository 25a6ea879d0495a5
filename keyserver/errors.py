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

log = logging.getLogger(__name__)

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 409: "conflict", 413: "body_too_large",
          415: "unsupported_media_type", 422: "invalid", 429: "rate_limited",
          500: "internal_error", 503: "unavailable"}


class ApiError(Exception):
    """Raised by handlers; rendered as the error shape with ``status``."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 detail: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.detail = detail
        self.headers = headers


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
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "request does not match the API", "invalid",
                              _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else _CODES.get(exc.status_code, "")
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error (logged on the key server)")
