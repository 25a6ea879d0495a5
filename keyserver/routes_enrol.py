"""Enrolment (identity bearer token): subscribers, publishers and root peers get their keys.

The issuance is recorded in the audit log before the keys are returned; if that
write fails the caller gets an error and no keys.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from credentials.certificates import ED25519_KEY_BYTES
from credentials.certificates import RootCertificate as SignedRootCertificate
from credentials.decompose import root_credential
from keyserver.api_models import (
    PublisherBundle,
    PublisherEnrolment,
    RootCertificate,
    RootEnrolment,
    SubscriberBundle,
    SubscriberEnrolment,
)
from keyserver.auth import AnIdentity, Caller, State, charge_keys
from keyserver.enrolment import (
    check_role,
    check_root_policy,
    issuance_detail,
    issue_bundle,
    plan_publisher,
    plan_subscriber,
    stored_policy,
    target_epoch,
    within_policy,
)
from keyserver.errors import ApiError, error_responses
from keyserver.repository import audit
from keyserver.state import AppState

router = APIRouter(prefix="/v1/enrol", tags=["enrolment"])


def _record(state: AppState, actor: str, action: str, epoch: int, detail: dict[str, Any]
            ) -> None:
    with state.sessions.begin() as session:
        audit(session, actor, action, epoch, detail)


async def _audited(state: AppState, caller: Caller, action: str, epoch: int,
                   detail: dict[str, Any]) -> None:
    await run_in_threadpool(_record, state, caller.name, action, epoch, detail)


@router.post("/subscriber", response_model=SubscriberBundle,
             responses=error_responses(401, 403, 409, 422))
async def enrol_subscriber(body: SubscriberEnrolment, caller: AnIdentity,
                           state: State) -> dict[str, Any]:
    """Keys for a subscription inside the identity's policy (403 names the clause it exceeds);
    every credential lies inside the policy's region, whatever max_credentials asks."""
    identity = caller.identity
    assert identity is not None
    check_role(identity.role, "subscriber")
    schema = state.store.schema
    policy = stored_policy(schema, identity.policy)
    predicate = within_policy(schema, body.subscription, policy, "subscription")
    epoch = target_epoch(state, body.epoch)
    creds, fine = plan_subscriber(schema, predicate, body.max_credentials, body.fine_depth,
                                  policy)
    charge_keys(state, caller, len(creds) + len(fine))
    bundle = await issue_bundle(state, caller.name, "subscriber", epoch, creds, fine)
    await _audited(state, caller, "issue_subscriber", epoch.number,
                   issuance_detail(identity.name, "subscriber", bundle)
                   | {"subscription": str(predicate)})
    return bundle


@router.post("/publisher", response_model=PublisherBundle,
             responses=error_responses(401, 403, 409, 422))
async def enrol_publisher(body: PublisherEnrolment, caller: AnIdentity,
                          state: State) -> dict[str, Any]:
    """Publisher keys for an advertisement inside the identity's policy."""
    identity = caller.identity
    assert identity is not None
    check_role(identity.role, "publisher")
    schema = state.store.schema
    policy = stored_policy(schema, identity.policy)
    predicate = within_policy(schema, body.advertisement, policy, "advertisement")
    epoch = target_epoch(state, body.epoch)
    creds = plan_publisher(schema, predicate, body.max_credentials, policy)
    charge_keys(state, caller, len(creds))
    bundle = await issue_bundle(state, caller.name, "publisher", epoch, creds, [])
    await _audited(state, caller, "issue_publisher", epoch.number,
                   issuance_detail(identity.name, "publisher", bundle)
                   | {"advertisement": str(predicate)})
    return bundle


@router.post("/root", response_model=RootCertificate,
             responses=error_responses(401, 403, 409, 422))
async def enrol_root(body: RootEnrolment, caller: AnIdentity,
                     state: State) -> dict[str, Any]:
    """Certify a root peer's Ed25519 transport key for one attribute tree
    (``credentials.certificates.root_certificate_message`` is what is signed)."""
    identity = caller.identity
    assert identity is not None
    check_role(identity.role, "root")
    schema = state.store.schema
    if body.attribute not in schema.names:
        raise ApiError(422, f"schema {schema.name!r} has no attribute {body.attribute!r}",
                       "unknown_attribute")
    try:
        transport_key = base64.b64decode(body.transport_key, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(422, "transport_key is not valid base64", "invalid_key") from exc
    if len(transport_key) != ED25519_KEY_BYTES:
        raise ApiError(422, "transport_key must be a raw 32-byte Ed25519 public key",
                       "invalid_key")
    check_root_policy(schema, body.attribute, identity.policy)
    charge_keys(state, caller, 1)
    epoch = target_epoch(state, body.epoch, time.time())
    expires_at = int(epoch.end + epoch.grace)
    certificate = SignedRootCertificate.issue(state.store.signing_key, body.attribute,
                                              transport_key, epoch.number, expires_at).signature
    token = await state.issuer.root_token(caller.name, epoch.number,
                                          root_credential(schema.attribute(body.attribute)))
    state.metrics.keys_issued("root_certificate", 1)
    state.metrics.keys_issued("routing_token", 1)
    await _audited(state, caller, "issue_root", epoch.number,
                   {"identity": identity.name, "role": "root", "attribute": body.attribute,
                    "transport_key": body.transport_key})
    return {"epoch": epoch.number, "epoch_end": epoch.end, "attribute": body.attribute,
            "transport_key": body.transport_key,
            "certificate": base64.b64encode(certificate).decode(), "expires_at": expires_at,
            "routing_token": token}
