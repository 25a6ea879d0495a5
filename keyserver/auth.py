"""Who is calling and how much they may ask: bearer tokens and rate limits.

``keyserver.middleware.Gate`` runs ``check_address`` and ``authenticate`` before a
request's body is read: the client-address limit first (so guessing tokens is limited
too), then the token the route needs (401 without a valid one, 403 for a revoked
identity), then the caller's request limit. Limits answer 429 with Retry-After. The
dependencies below only take the caller the gate found. Issuance is metered apart, in
keys (``charge_keys``), because one request can ask for a thousand of them.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from ibe_pubsub.keyserver.actors import ADMIN, RESERVED, is_reserved
from ibe_pubsub.keyserver.db import Identity
from ibe_pubsub.keyserver.errors import ApiError
from ibe_pubsub.keyserver.keystore import token_hash
from ibe_pubsub.keyserver.ratelimit import RateLimiter
from ibe_pubsub.keyserver.repository import identity_by_token
from ibe_pubsub.keyserver.state import AppState

# Declares the bearer scheme in the OpenAPI document; the gate does the checking.
bearer = HTTPBearer(auto_error=False, description="admin token or identity token")
BearerToken = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
Need = Literal["admin", "identity", "any"]


@dataclass(frozen=True)
class Caller:
    """Who is calling: the admin (identity None) or an identity."""

    identity: Identity | None

    @property
    def name(self) -> str:
        return ADMIN if self.identity is None else self.identity.name

    @property
    def limit_key(self) -> str:
        return "id:" + (ADMIN if self.identity is None else str(self.identity.id))


def app_state(request: Request) -> AppState:
    return request.app.state.keyserver


def _limit(limiter: RateLimiter, key: str, cost: float = 1.0) -> None:
    wait = limiter.acquire(key, cost)
    if wait is not None:
        retry = max(1, math.ceil(wait))
        raise ApiError(429, f"rate limit exceeded; retry in {retry} s",
                       headers={"Retry-After": str(retry)})


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": "Bearer"})


def check_address(state: AppState, scope: Scope) -> None:
    """The per-client-address request limit, for every route (429)."""
    client = scope.get("client")
    _limit(state.address_limits, "addr:" + (client[0] if client else "?"))


def bearer_token(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if there is one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return (token.strip() or None) if scheme.lower() == "bearer" else None
    return None


def _identity(state: AppState, token: str) -> Identity | None:
    with state.sessions() as session:
        return identity_by_token(session, token_hash(token))


def _is_admin(state: AppState, token: str) -> bool:
    return hmac.compare_digest(token_hash(token), state.store.admin_token_hash)


async def authenticate(state: AppState, scope: Scope, need: Need) -> None:
    """Find the caller a protected route needs and keep it in the request's state (where
    ``audit_refusal`` finds its name), or raise 401/403/429. The database lookup runs off
    the event loop."""
    token = bearer_token(scope)
    if token is None:
        raise _unauthorized("missing bearer token")
    if need != "identity" and _is_admin(state, token):
        caller = Caller(None)
    elif need == "admin":
        raise _unauthorized("invalid admin token")
    else:
        identity = await run_in_threadpool(_identity, state, token)
        if identity is None:
            raise _unauthorized("invalid identity token")
        caller = Caller(identity)
    scope.setdefault("state", {})["caller"] = caller
    if caller.identity is not None and caller.identity.revoked_at is not None:
        raise ApiError(403, f"identity {caller.identity.name!r} is revoked", "revoked")
    _limit(state.identity_limits, caller.limit_key)


def check_names(names: Iterable[str]) -> None:
    """422 for identity names that would pass for a reserved actor (``keyserver.actors``)."""
    taken = sorted({n for n in names if is_reserved(n)})
    if taken:
        raise ApiError(422, f"identity names {taken} are reserved (in any letter case: "
                       f"{sorted(RESERVED)})", "reserved_name")


def charge_keys(state: AppState, caller: Caller, keys: int) -> None:
    """Meter issuance per identity in keys (credential keys and fine routing tokens), so the
    limit follows the work and not the number of requests (429 beyond)."""
    _limit(state.key_limits, caller.limit_key, keys)


def _caller(request: Request) -> Caller:
    caller: Caller | None = getattr(request.state, "caller", None)
    if caller is None:  # a route the gate does not protect: refuse rather than serve it
        raise _unauthorized("missing bearer token")
    return caller


async def require_admin(request: Request, _: BearerToken) -> Caller:
    caller = _caller(request)
    if caller.identity is not None:
        raise _unauthorized("invalid admin token")
    return caller


async def require_identity(request: Request, _: BearerToken) -> Caller:
    """A valid, unrevoked identity."""
    caller = _caller(request)
    if caller.identity is None:
        raise _unauthorized("invalid identity token")
    return caller


async def require_caller(request: Request, _: BearerToken) -> Caller:
    """The admin or a valid, unrevoked identity."""
    return _caller(request)


State = Annotated[AppState, Depends(app_state)]
Admin = Annotated[Caller, Depends(require_admin)]
AnIdentity = Annotated[Caller, Depends(require_identity)]
AnyCaller = Annotated[Caller, Depends(require_caller)]
