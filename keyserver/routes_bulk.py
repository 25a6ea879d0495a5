"""Bulk issuance (admin): chunks of already decomposed credentials, idempotent by chunk id.

The result of each chunk is kept in the database sealed with ChaCha20-Poly1305 under
a key derived (HKDF) from the master secret, with the chunk id as associated data.
A chunk id seen before returns that stored result and issues nothing; the same id
with different content is a 409. Identities named in a chunk are created if missing,
without a policy and marked bulk-only: they receive keys only through bulk issuance (the
enrolment endpoints refuse them), and their token, derived from the master secret and
the name, is in every bundle issued to them, so each epoch's bundle is enough to run a
peer. Items of revoked identities, whose role differs from the stored one, or with a
credential whose region leaves the identity's stored policy (the same check as
enrolment, ``enrolment.check_issued``) get an ``error`` field instead of keys. Every
bundle names the server key and schema and is signed with the server key
(``credentials.certificates.bundle_message``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from fastapi import APIRouter
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from ibe_pubsub.credentials import Credential, bundle_message
from ibe_pubsub.keyserver.actors import ADMIN
from ibe_pubsub.keyserver.api_models import BulkIn, BulkItem, BulkOut
from ibe_pubsub.keyserver.auth import Admin, Caller, State, check_names
from ibe_pubsub.keyserver.db import BulkChunk, Identity
from ibe_pubsub.keyserver.enrolment import (
    check_issued,
    issuance_detail,
    issue_bundle,
    joined_trees,
    parse_bulk_credential,
    single_server_only,
    stored_policy,
    target_epoch,
)
from ibe_pubsub.keyserver.epochs import Epoch
from ibe_pubsub.keyserver.errors import ApiError, error_responses
from ibe_pubsub.keyserver.keystore import b64, token_hash
from ibe_pubsub.keyserver.locks import AdvisoryLock, holding
from ibe_pubsub.keyserver.repository import audit, bulk_chunk, grant_trees, identity_by_name
from ibe_pubsub.keyserver.state import AppState

router = APIRouter(prefix="/v1/admin", tags=["admin"])
RESULT_KEY_PURPOSE = b"bulk-results"
TOKEN_KEY_PURPOSE = b"bulk-identity-tokens"


def _request_hash(body: BulkIn) -> str:
    canonical = json.dumps(body.model_dump(exclude={"chunk_id"}), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _seal(state: AppState, chunk_id: str, result: dict[str, Any]) -> bytes:
    nonce = os.urandom(12)
    aead = ChaCha20Poly1305(state.store.derived_key(RESULT_KEY_PURPOSE))
    return nonce + aead.encrypt(nonce, json.dumps(result).encode(), chunk_id.encode())


def _unseal(state: AppState, chunk: BulkChunk) -> dict[str, Any]:
    aead = ChaCha20Poly1305(state.store.derived_key(RESULT_KEY_PURPOSE))
    blob = chunk.sealed_result
    return json.loads(aead.decrypt(blob[:12], blob[12:], chunk.chunk_id.encode()))


def _stored(state: AppState, chunk_id: str, request_hash: str) -> dict[str, Any] | None:
    with state.sessions() as session:
        chunk = bulk_chunk(session, chunk_id)
        if chunk is None:
            return None
        if chunk.request_hash != request_hash:
            raise ApiError(409, f"chunk id {chunk_id!r} was used for different content",
                           "chunk_conflict")
        return _unseal(state, chunk)


def bulk_token(key: bytes, name: str) -> str:
    """The bearer token of bulk-only identity ``name`` under ``key`` (derived from the master
    secret for ``TOKEN_KEY_PURPOSE``): the same whenever it is issued keys."""
    mac = hmac.new(key, name.encode(), hashlib.sha256).digest()
    return "bulk_" + base64.urlsafe_b64encode(mac).decode().rstrip("=")


@dataclass(frozen=True)
class Known:
    """What bulk issuance needs of a stored identity (``token``: a bulk-only one's)."""

    role: str
    revoked: bool
    policy: str | None
    token: str | None


def _identity_states(state: AppState, caller: Caller, items: list[BulkItem], epoch: int
                     ) -> dict[str, Known]:
    """Role, revoked flag, policy and token of every named identity, creating the missing
    ones bulk-only. A bulk-only identity's stored token hash is (re)set to its token: one
    that an earlier release created has another (migration 0003 marks those)."""
    key = state.store.derived_key(TOKEN_KEY_PURPOSE)
    for attempt in range(2):
        try:
            with state.sessions.begin() as session:
                out: dict[str, Known] = {}
                for item in items:
                    if item.identity in out:
                        continue
                    identity = identity_by_name(session, item.identity)
                    token = bulk_token(key, item.identity)
                    if identity is None:
                        identity = Identity(name=item.identity, role=item.role, policy=None,
                                            token_hash=token_hash(token),
                                            created_at=time.time(), bulk_only=True)
                        session.add(identity)
                        audit(session, caller.name, "create_identity", epoch,
                              {"identity": item.identity, "role": item.role, "via": "bulk"})
                    elif identity.bulk_only and identity.token_hash != token_hash(token):
                        identity.token_hash = token_hash(token)
                    out[item.identity] = Known(identity.role, identity.revoked_at is not None,
                                               identity.policy,
                                               token if identity.bulk_only else None)
                return out
        except IntegrityError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def _store(state: AppState, caller: Caller, body: BulkIn, request_hash: str,
           result: dict[str, Any]) -> dict[str, Any]:
    """Store the chunk, its audit entries and its subscribers' tree grants together; a
    concurrent twin wins if first."""
    try:
        with state.sessions.begin() as session:
            session.add(BulkChunk(chunk_id=body.chunk_id, request_hash=request_hash,
                                  epoch=result["epoch"], created_at=time.time(),
                                  sealed_result=_seal(state, body.chunk_id, result)))
            for bundle in result["bundles"]:
                if "error" not in bundle:
                    audit(session, caller.name, "issue_bulk", result["epoch"],
                          issuance_detail(bundle["identity"], bundle["role"], bundle)
                          | {"chunk_id": body.chunk_id})
                    if bundle["role"] == "subscriber":
                        identity = identity_by_name(session, bundle["identity"])
                        assert identity is not None  # _identity_states made it
                        grant_trees(session, identity.id,
                                    joined_trees(state.store.schema, bundle["credentials"]),
                                    bundle["expires_at"])
        return result
    except IntegrityError:
        stored = _stored(state, body.chunk_id, request_hash)
        if stored is None:
            raise
        return stored


def _signed(state: AppState, bundle: dict[str, Any], token: str | None) -> dict[str, Any]:
    """The bundle with the server key, the schema id, a bulk-only identity's token, and
    the server's signature over all of it."""
    store = state.store
    signed = bundle | {"server_key": b64(store.server_key), "schema_id": store.schema.id}
    if token is not None:
        signed["token"] = token
    return signed | {"signature": b64(store.signing_key.sign(bundle_message(signed)))}


async def _bundle(state: AppState, item: BulkItem, creds: list[Credential],
                  known: dict[str, Known], epoch: Epoch) -> dict[str, Any]:
    stored = known[item.identity]
    head = {"identity": item.identity, "role": item.role}
    if stored.revoked:
        return head | {"error": "identity is revoked"}
    if stored.role != item.role:
        return head | {"error": f"identity is a {stored.role}"}
    outside = check_issued(state.store.schema, creds,
                           stored_policy(state.store.schema, stored.policy))
    if outside is not None:
        return head | {"error": outside}
    coarse = [c for c, spec in zip(creds, item.credentials, strict=True) if not spec.fine]
    fine = [c for c, spec in zip(creds, item.credentials, strict=True) if spec.fine]
    if item.role == "publisher" and fine:
        return head | {"error": "fine credentials are for subscribers"}
    issued = await issue_bundle(state, ADMIN, item.role, epoch, coarse, fine)
    return _signed(state, head | issued, stored.token)


@router.post("/bulk", response_model=BulkOut, responses=error_responses(401, 409, 422))
async def bulk(body: BulkIn, caller: Admin,
               state: State) -> dict[str, Any]:
    """Issue keys for a chunk of decomposed credentials; repeating a chunk id is safe, also
    on another replica at the same time (one chunk id is issued by one process at a time:
    an asyncio lock within a process, an advisory lock of the database across them)."""
    single_server_only(state, "bulk issuance")
    check_names(item.identity for item in body.items)
    request_hash = _request_hash(body)
    lock = state.chunk_locks.setdefault(body.chunk_id, asyncio.Lock())
    try:
        async with lock, holding(AdvisoryLock(state.engine, "bulk-chunk:" + body.chunk_id)):
            return await _issue_chunk(state, caller, body, request_hash)
    finally:
        if not lock.locked():
            state.chunk_locks.pop(body.chunk_id, None)


async def _issue_chunk(state: AppState, caller: Caller, body: BulkIn, request_hash: str
                       ) -> dict[str, Any]:
    """The stored result of the chunk, or keys issued and stored now."""
    stored = await run_in_threadpool(_stored, state, body.chunk_id, request_hash)
    if stored is not None:
        return stored
    schema = state.store.schema
    parsed = [[parse_bulk_credential(schema, c) for c in item.credentials]
              for item in body.items]
    epoch = target_epoch(state, body.epoch)
    known = await run_in_threadpool(_identity_states, state, caller, body.items, epoch.number)
    bundles = await asyncio.gather(*(_bundle(state, item, creds, known, epoch)
                                     for item, creds in zip(body.items, parsed, strict=True)))
    result = {"chunk_id": body.chunk_id, "epoch": epoch.number, "bundles": bundles}
    return await run_in_threadpool(_store, state, caller, body, request_hash, result)
