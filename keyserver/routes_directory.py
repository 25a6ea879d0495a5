"""The bootstrap directory: peers register per attribute tree with a time-to-live; joiners
look up the tree's root(s) and a random sample of its other members."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from sqlalchemy.exc import IntegrityError

from keyserver.api_models import DirectoryEntryOut, DirectoryIn, DirectoryOut
from keyserver.auth import AnIdentity, AnyCaller, State
from keyserver.db import Identity
from keyserver.errors import ApiError, error_responses
from keyserver.repository import lookup_peers, register_peer
from keyserver.state import AppState

router = APIRouter(prefix="/v1/directory", tags=["directory"])


def _check_attribute(state: AppState, attribute: str) -> None:
    schema = state.store.schema
    if attribute not in schema.names:
        raise ApiError(422, f"schema {schema.name!r} has no attribute {attribute!r}",
                       "unknown_attribute")


def _register(state: AppState, identity: Identity, body: DirectoryIn, expires_at: float
              ) -> None:
    with state.sessions.begin() as session:
        register_peer(session, identity, body.attribute, body.address, body.role, expires_at)


@router.post("", response_model=DirectoryEntryOut, status_code=201,
             responses=error_responses(401, 403, 422))
def register(body: DirectoryIn, caller: AnIdentity,
             state: State) -> dict[str, Any]:
    """Register (or refresh) this peer's address in one tree; the role must be the
    identity's own."""
    identity = caller.identity
    assert identity is not None
    _check_attribute(state, body.attribute)
    if body.role != identity.role:
        raise ApiError(403, f"a {identity.role} identity cannot register as {body.role}",
                       "wrong_role")
    expires_at = time.time() + body.ttl
    try:
        _register(state, identity, body, expires_at)
    except IntegrityError:  # a concurrent first registration of the same entry won the insert
        _register(state, identity, body, expires_at)
    return {"address": body.address, "role": body.role, "identity": identity.name,
            "expires_at": expires_at}


@router.get("/{attribute}", response_model=DirectoryOut,
            responses=error_responses(401, 403, 422))
def lookup(attribute: Annotated[str, Path(max_length=200)], _: AnyCaller, state: State,
           sample: Annotated[int, Query(ge=0, le=100)] = 8) -> dict[str, Any]:
    """Live roots of the tree and up to ``sample`` random other live members."""
    _check_attribute(state, attribute)
    with state.sessions() as session:
        roots, members = lookup_peers(session, attribute, time.time(), sample)

    def out(entries: list[Any]) -> list[dict[str, Any]]:
        return [{"address": e.address, "role": e.role, "identity": name,
                 "expires_at": e.expires_at} for e, name in entries]
    return {"attribute": attribute, "roots": out(roots), "members": out(members)}
