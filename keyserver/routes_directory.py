"""The bootstrap directory, owned: a peer lists only addresses certified to its identity
(``keyserver.ownership``), as leases that end with its ttl or its certificate, whichever
comes first. Joiners look up the tree's roots and a sample of its other members, those
another identity saw answering recently (vouched) first.

A lookup names no identity, and shows a tree's members only to those who join it: the
admin, a root whose policy leaves the attribute whole, a subscriber holding valid
credentials that join the tree (granted at issuance, ``enrolment.joined_trees``; its own
registrations count for nothing, anyone could make them first). A publisher sees the roots
alone; roots and subscribers are refused other trees (403 ``not_in_tree``), so no caller
reads which attributes the subscribers of other trees constrain."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from sqlalchemy.exc import IntegrityError

from ibe_pubsub.keyserver.api_models import DirectoryEntryOut, DirectoryIn, DirectoryOut
from ibe_pubsub.keyserver.auth import AnIdentity, AnyCaller, Caller, State
from ibe_pubsub.keyserver.db import DirectoryEntry, Identity
from ibe_pubsub.keyserver.enrolment import check_root_policy, root_attributes
from ibe_pubsub.keyserver.errors import ApiError, error_responses
from ibe_pubsub.keyserver.ownership import check_canonical, check_not_owned_by_other, owned_until
from ibe_pubsub.keyserver.repository import (
    holds_tree,
    is_vouched,
    lookup_peers,
    register_peer,
    remove_entries_at,
    vouch,
)
from ibe_pubsub.keyserver.state import AppState

router = APIRouter(prefix="/v1/directory", tags=["directory"])

VOUCH_WINDOW = 60.0
"""Seconds a vouch counts. Peers renew their leases, vouching for the neighbours that
answered them, every third of their ttl (30 s by default), so a member with live
neighbours stays vouched while one that stopped answering drops back within a minute."""


def _check_attribute(state: AppState, attribute: str) -> None:
    schema = state.store.schema
    if attribute not in schema.names:
        raise ApiError(422, f"schema {schema.name!r} has no attribute {attribute!r}",
                       "unknown_attribute")


def _register(state: AppState, identity: Identity, body: DirectoryIn, now: float
              ) -> DirectoryEntry:
    with state.sessions.begin() as session:
        expires_at = min(now + body.ttl, owned_until(session, identity.id, body.address, now))
        entry = register_peer(session, identity, body.attribute, body.address, body.role,
                              expires_at)
    # The vouches in a transaction of their own: two neighbours renewing at once, each
    # holding its own entry while waiting for the other's, deadlocked on PostgreSQL.
    with state.sessions.begin() as session:
        vouch(session, identity.id, body.attribute, body.seen, now)
    return entry


def _out(entry: DirectoryEntry, now: float) -> dict[str, Any]:
    return {"address": entry.address, "role": entry.role, "expires_at": entry.expires_at,
            "vouched": is_vouched(entry, now - VOUCH_WINDOW)}


def _sees_members(state: AppState, caller: Caller, attribute: str, now: float) -> bool:
    """Whether the caller may see the tree's members (True), only its roots (False, a
    publisher, which sends to roots alone), or nothing (403 ``not_in_tree``)."""
    identity = caller.identity
    if identity is None:
        return True
    if identity.role == "publisher":
        return False
    if identity.role == "root":
        allowed = attribute in root_attributes(state.store.schema, identity.policy)
    else:
        with state.sessions() as session:
            allowed = holds_tree(session, identity.id, attribute, now)
    if not allowed:
        raise ApiError(403, f"identity {identity.name!r} is not in the tree of {attribute!r}: a "
                       f"{identity.role} looks up only the trees it joins", "not_in_tree")
    return True


@router.post("", response_model=DirectoryEntryOut, status_code=201,
             responses=error_responses(401, 403, 422))
def register(body: DirectoryIn, caller: AnIdentity, state: State) -> dict[str, Any]:
    """Register (or refresh) this peer's lease in one tree, for an address certified to the
    identity (403 ``address_not_certified`` otherwise), as its own role, as a root only of a
    tree its policy leaves whole; vouch for the ``seen`` neighbours of other identities."""
    identity = caller.identity
    assert identity is not None
    _check_attribute(state, body.attribute)
    check_canonical([body.address], "address")
    check_canonical(body.seen, "seen")
    if body.role != identity.role:
        raise ApiError(403, f"a {identity.role} identity cannot register as {body.role}",
                       "wrong_role")
    if body.role == "root":
        check_root_policy(state.store.schema, body.attribute, identity.policy)
    now = time.time()
    try:
        entry = _register(state, identity, body, now)
    except IntegrityError:  # a concurrent first registration of the same entry won the insert
        entry = _register(state, identity, body, now)
    return _out(entry, now)


@router.get("/{attribute}", response_model=DirectoryOut,
            responses=error_responses(401, 403, 422))
def lookup(attribute: Annotated[str, Path(max_length=200)], caller: AnyCaller, state: State,
           sample: Annotated[int, Query(ge=0, le=100)] = 8) -> dict[str, Any]:
    """Live roots of the tree and up to ``sample`` other live members: vouched ones first,
    then unvouched ones to fill up. Members only for the admin, the tree's roots and its
    subscribers; a publisher gets the roots alone; 403 ``not_in_tree`` for a root or
    subscriber outside the tree."""
    _check_attribute(state, attribute)
    now = time.time()
    if not _sees_members(state, caller, attribute, now):
        sample = 0
    with state.sessions() as session:
        roots, members = lookup_peers(session, attribute, now, sample, now - VOUCH_WINDOW)
    return {"attribute": attribute, "roots": [_out(e, now) for e in roots],
            "members": [_out(e, now) for e in members]}


@router.delete("/{address}", status_code=204, response_class=Response,
               responses=error_responses(401, 403, 422))
def deregister(address: Annotated[str, Path(max_length=300)], caller: AnIdentity,
               state: State) -> Response:
    """Remove the caller's entries for its address in every tree (a peer leaving); 403
    ``not_owner`` while the address is certified to another identity."""
    identity = caller.identity
    assert identity is not None
    check_canonical([address], "address")
    with state.sessions.begin() as session:
        check_not_owned_by_other(session, identity.id, address, time.time())
        remove_entries_at(session, identity.id, address)
    return Response(status_code=204)  # no body, so no content type either
