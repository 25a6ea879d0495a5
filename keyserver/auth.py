"""Bearer-token authentication and rate limits, as FastAPI dependencies.

The client-address limit is taken before the token is checked, so guessing tokens
is rate limited too; the identity limit after. Both answer 429 with Retry-After.
"""

from __future__ import annotations

import hmac
import math
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from keyserver.db import Identity
from keyserver.errors import ApiError
from keyserver.keystore import token_hash
from keyserver.ratelimit import RateLimiter
from keyserver.repository import identity_by_token
from keyserver.state import AppState

bearer = HTTPBearer(auto_error=False, description="admin token or identity token")
BearerToken = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
ADMIN = "admin"


@dataclass(frozen=True)
class Caller:
    """Who is calling: the admin (identity None) or an identity."""

    identity: Identity | None

    @property
    def name(self) -> str:
        return ADMIN if self.identity is None else self.identity.name


def app_state(request: Request) -> AppState:
    return request.app.state.keyserver


def _limit(limiter: RateLimiter, key: str) -> None:
    wait = limiter.acquire(key)
    if wait is not None:
        retry = max(1, math.ceil(wait))
        raise ApiError(429, f"rate limit exceeded; retry in {retry} s",
                       headers={"Retry-After": str(retry)})


def _token(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str:
    state = app_state(request)
    _limit(state.address_limits, "addr:" + (request.client.host if request.client else "?"))
    if credentials is None or not credentials.credentials:
        raise ApiError(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    return credentials.credentials


def _identity(state: AppState, token: str) -> Identity | None:
    with state.sessions() as session:
        return identity_by_token(session, token_hash(token))


def _is_admin(state: AppState, token: str) -> bool:
    return hmac.compare_digest(token_hash(token), state.store.admin_token_hash)


def require_admin(request: Request, credentials: BearerToken) -> Caller:
    token = _token(request, credentials)
    state = app_state(request)
    if not _is_admin(state, token):
        raise ApiError(401, "invalid admin token", headers={"WWW-Authenticate": "Bearer"})
    _limit(state.identity_limits, "id:" + ADMIN)
    return Caller(None)


def require_identity(request: Request, credentials: BearerToken) -> Caller:
    """A valid, unrevoked identity."""
    token = _token(request, credentials)
    state = app_state(request)
    identity = _identity(state, token)
    if identity is None:
        raise ApiError(401, "invalid identity token", headers={"WWW-Authenticate": "Bearer"})
    if identity.revoked_at is not None:
        raise ApiError(403, f"identity {identity.name!r} is revoked", "revoked")
    _limit(state.identity_limits, f"id:{identity.id}")
    return Caller(identity)


def require_caller(request: Request, credentials: BearerToken) -> Caller:
    """The admin or a valid, unrevoked identity."""
    if credentials is not None and _is_admin(app_state(request), credentials.credentials):
        return require_admin(request, credentials)
    return require_identity(request, credentials)


State = Annotated[AppState, Depends(app_state)]
Admin = Annotated[Caller, Depends(require_admin)]
AnIdentity = Annotated[Caller, Depends(require_identity)]
AnyCaller = Annotated[Caller, Depends(require_caller)]
