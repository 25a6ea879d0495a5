"""Admin endpoints (admin bearer token): identities, revocation, the audit log."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from sqlalchemy.exc import IntegrityError

from ibe_pubsub.keyserver.api_models import AuditOut, IdentityCreated, IdentityIn, IdentityOut
from ibe_pubsub.keyserver.auth import Admin, State, check_names
from ibe_pubsub.keyserver.db import Identity
from ibe_pubsub.keyserver.enrolment import parse
from ibe_pubsub.keyserver.errors import ApiError, error_responses
from ibe_pubsub.keyserver.keystore import new_token, token_hash
from ibe_pubsub.keyserver.repository import (
    audit,
    audit_entries,
    identities,
    latest_bulk_issuances,
    remove_directory_entries,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"])
IdentityId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def _out(identity: Identity, bulk_issued: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": identity.id, "name": identity.name, "role": identity.role,
            "policy": identity.policy, "created_at": identity.created_at,
            "revoked_at": identity.revoked_at, "revoked_epoch": identity.revoked_epoch,
            "bulk_only": identity.bulk_only, "bulk_issued": bulk_issued}


@router.post("/identities", response_model=IdentityCreated, status_code=201,
             responses=error_responses(401, 409, 422))
def create_identity(body: IdentityIn, caller: Admin,
                    state: State) -> dict[str, Any]:
    """Create an identity; the response carries its bearer token, which is never shown again.
    Names of the server's own actors (``admin``, ...) are refused in any letter case."""
    check_names([body.name])
    policy = None if body.policy is None else str(
        parse(state.store.schema, body.policy, "policy"))
    token = new_token(body.role[:3])
    try:
        with state.sessions.begin() as session:
            identity = Identity(name=body.name, role=body.role, policy=policy,
                                token_hash=token_hash(token), created_at=time.time())
            session.add(identity)
            session.flush()
            audit(session, caller.name, "create_identity", state.epoch().number,
                  {"identity": body.name, "id": identity.id, "role": body.role,
                   "policy": policy})
    except IntegrityError as exc:
        raise ApiError(409, f"an identity named {body.name!r} exists", "exists") from exc
    return {"id": identity.id, "name": identity.name, "role": identity.role,
            "policy": policy, "token": token}


@router.get("/identities", response_model=list[IdentityOut], responses=error_responses(401))
def list_identities(_: Admin,
                    state: State) -> list[dict[str, Any]]:
    """Every identity; with what bulk issuance last gave it, if anything (for a bulk-only
    identity, whose policy is empty, that is all it may hold)."""
    with state.sessions() as session:
        issued = latest_bulk_issuances(session)
        return [_out(i, issued.get(i.name)) for i in identities(session)]


@router.get("/identities/{identity_id}", response_model=IdentityOut,
            responses=error_responses(401, 404, 422))
def get_identity(identity_id: IdentityId, _: Admin,
                 state: State) -> dict[str, Any]:
    with state.sessions() as session:
        identity = session.get(Identity, identity_id)
        if identity is None:
            raise ApiError(404, f"no identity with id {identity_id}")
        return _out(identity)


@router.post("/identities/{identity_id}/revoke", response_model=IdentityOut,
             responses=error_responses(401, 404, 422))
def revoke(identity_id: IdentityId, caller: Admin,
           state: State) -> dict[str, Any]:
    """Revoke now: enrolment answers 403 at once, so nothing is issued from the next epoch
    on, and its directory entries are removed. The addresses it certified stay its own
    (refused to other identities) until its certificates naming them expire, since those
    stay valid until then. Revoking twice is harmless."""
    epoch = state.epoch().number
    with state.sessions.begin() as session:
        identity = session.get(Identity, identity_id)
        if identity is None:
            raise ApiError(404, f"no identity with id {identity_id}")
        if identity.revoked_at is None:
            identity.revoked_at, identity.revoked_epoch = time.time(), epoch
            remove_directory_entries(session, identity.id)
            audit(session, caller.name, "revoke_identity", epoch,
                  {"identity": identity.name, "id": identity.id})
        return _out(identity)


@router.get("/audit", response_model=list[AuditOut], responses=error_responses(401, 422))
def read_audit(_: Admin, state: State, after: Annotated[int, Query(ge=0, le=2**62)] = 0,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    """Audit entries with id > ``after``, oldest first."""
    with state.sessions() as session:
        return [{"id": e.id, "at": e.at, "actor": e.actor, "action": e.action,
                 "epoch": e.epoch, "detail": e.detail}
                for e in audit_entries(session, after, limit)]
