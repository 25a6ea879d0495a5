"""Enrolment (identity bearer token): subscribers, publishers and root peers get their keys,
and every peer a certificate of its link key from the peer-link CA. An identity created by
bulk issuance gets its keys only from there (403 ``bulk_only`` here), but its link
certificate here like any other.

The issuance is recorded in the audit log before the keys are returned; if that
write fails the caller gets an error and no keys.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from ibe_pubsub.credentials import (
    ED25519_KEY_BYTES,
    Credential,
    PeerBinding,
    Predicate,
    Schema,
    fingerprint,
    issue_peer_certificate,
    root_credential,
    to_pem,
)
from ibe_pubsub.credentials import RootCertificate as SignedRootCertificate
from ibe_pubsub.keyserver.api_models import (
    CallerOut,
    HeldAddressesOut,
    PublisherBundle,
    PublisherEnrolment,
    RootCertificate,
    RootEnrolment,
    SubscriberBundle,
    SubscriberEnrolment,
    TransportCertificateOut,
    TransportEnrolment,
)
from ibe_pubsub.keyserver.auth import AnIdentity, Caller, State, charge_keys
from ibe_pubsub.keyserver.db import Identity
from ibe_pubsub.keyserver.enrolment import (
    check_role,
    check_root_policy,
    issuance_detail,
    issue_bundle,
    joined_trees,
    plan_publisher,
    plan_subscriber,
    root_attributes,
    single_server_only,
    stored_policy,
    target_epoch,
    within_policy,
)
from ibe_pubsub.keyserver.epochs import Epoch
from ibe_pubsub.keyserver.errors import ApiError, error_responses
from ibe_pubsub.keyserver.ownership import check_canonical, claim_addresses, held_addresses
from ibe_pubsub.keyserver.repository import audit, grant_trees
from ibe_pubsub.keyserver.state import AppState

router = APIRouter(prefix="/v1/enrol", tags=["enrolment"])


Grant = tuple[int, list[str], float]
"""A subscriber's identity id, the trees it joins and until when (``grant_trees``)."""


def _record(state: AppState, actor: str, action: str, epoch: int, detail: dict[str, Any],
            grant: Grant | None = None) -> None:
    """Audit the issuance and grant a subscriber its trees, in one transaction."""
    with state.sessions.begin() as session:
        audit(session, actor, action, epoch, detail)
        if grant is not None:
            grant_trees(session, *grant)


async def _audited(state: AppState, caller: Caller, action: str, epoch: int,
                   detail: dict[str, Any], grant: Grant | None = None) -> None:
    await run_in_threadpool(_record, state, caller.name, action, epoch, detail, grant)


def _may_enrol(identity: Identity) -> None:
    """403 for a bulk-only identity: it has no policy, so enrolling would let it have keys
    for anything."""
    if identity.bulk_only:
        raise ApiError(403, f"identity {identity.name!r} receives its keys only through bulk "
                       "issuance: use the bundle `bulk issue` wrote for it (--bundle FILE)",
                       "bulk_only")


def decoded_bytes(text: str, field: str, size: int, what: str, code: str) -> bytes:
    """``size`` raw bytes from base64 (422 ``code`` otherwise, saying ``field`` must be
    ``what``)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(422, f"{field} is not valid base64", code) from exc
    if len(raw) != size:
        raise ApiError(422, f"{field} must be {what}", code)
    return raw


def _ed25519_key(text: str, field: str) -> bytes:
    return decoded_bytes(text, field, ED25519_KEY_BYTES, "a raw 32-byte Ed25519 public key",
                         "invalid_key")


@router.get("/identity", response_model=CallerOut, responses=error_responses(401, 403))
def whoami(caller: AnIdentity) -> dict[str, Any]:
    """The identity the token belongs to, so a peer can check that a bundle is this
    identity's before it certifies an address for it."""
    identity = caller.identity
    assert identity is not None
    return {"name": identity.name, "role": identity.role, "bulk_only": identity.bulk_only}


def _enrolling(caller: Caller, role: str) -> Identity:
    """The caller's identity, if it may enrol as ``role`` here (403 otherwise)."""
    identity = caller.identity
    assert identity is not None
    _may_enrol(identity)
    check_role(identity.role, role)
    return identity


Plan = Callable[[Schema, Predicate, Predicate | None], tuple[list[Credential], list[Credential]]]
Issue = Callable[[AppState, str, str, Epoch, list[Credential], list[Credential]],
                 Awaitable[dict[str, Any]]]
"""``issue_bundle``'s signature: keys (or a threshold member's shares) for one enrolment."""


async def enrol_keys(state: AppState, caller: Caller, role: str, what: str, text: str,
                     epoch: Epoch, plan: Plan, issue: Issue = issue_bundle) -> dict[str, Any]:
    """The pipeline of every key enrolment, version 2's and a threshold member's: the
    predicate ``text`` (the ``what``) checked against the identity's policy, its credentials
    (and fine credentials) planned, charged, issued for ``epoch``, and audited before the
    bundle is returned."""
    identity = _enrolling(caller, role)
    schema = state.store.schema
    policy = stored_policy(schema, identity.policy)
    predicate = within_policy(schema, text, policy, what)
    creds, fine = plan(schema, predicate, policy)
    charge_keys(state, caller, len(creds) + len(fine))
    bundle = await issue(state, caller.name, role, epoch, creds, fine)
    await _audited(state, caller, f"issue_{role}", epoch.number,
                   issuance_detail(identity.name, role, bundle) | {what: str(predicate)},
                   (identity.id, joined_trees(schema, bundle["credentials"]),
                    bundle["expires_at"]) if role == "subscriber" else None)
    return bundle


def subscriber_plan(body: SubscriberEnrolment) -> Plan:
    return lambda schema, predicate, policy: plan_subscriber(
        schema, predicate, body.max_credentials, body.fine_depth, policy)


def publisher_plan(body: PublisherEnrolment) -> Plan:
    return lambda schema, predicate, policy: (plan_publisher(
        schema, predicate, body.max_credentials, policy), [])


@router.post("/subscriber", response_model=SubscriberBundle,
             responses=error_responses(401, 403, 409, 422))
async def enrol_subscriber(body: SubscriberEnrolment, caller: AnIdentity,
                           state: State) -> dict[str, Any]:
    """Keys for a subscription inside the identity's policy (403 names the clause it exceeds);
    every credential lies inside the policy's region, whatever max_credentials asks."""
    single_server_only(state, "subscriber keys")
    return await enrol_keys(state, caller, "subscriber", "subscription", body.subscription,
                            target_epoch(state, body.epoch), subscriber_plan(body))


@router.post("/publisher", response_model=PublisherBundle,
             responses=error_responses(401, 403, 409, 422))
async def enrol_publisher(body: PublisherEnrolment, caller: AnIdentity,
                          state: State) -> dict[str, Any]:
    """Publisher keys for an advertisement inside the identity's policy."""
    single_server_only(state, "publisher keys")
    return await enrol_keys(state, caller, "publisher", "advertisement", body.advertisement,
                            target_epoch(state, body.epoch), publisher_plan(body))


RootAnswer = Callable[[AppState, str, Credential, bytes, Epoch, int],
                      Awaitable[dict[str, Any]]]
"""What a root enrolment answers for (identity, whole-domain credential, transport key,
epoch, expiry): version 2's certificate and token, or a threshold member's shares of them."""


async def enrol_root_with(state: AppState, caller: Caller, body: RootEnrolment,
                          answer: RootAnswer) -> dict[str, Any]:
    """The pipeline of every root enrolment, version 2's and a threshold member's: the
    role, the attribute, the transport key and the identity's policy checked (a root holds
    the whole domain), then the epoch asked for (409 outside its window), one key charged,
    answered, and audited."""
    identity = _enrolling(caller, "root")
    schema = state.store.schema
    if body.attribute not in schema.names:
        raise ApiError(422, f"schema {schema.name!r} has no attribute {body.attribute!r}",
                       "unknown_attribute")
    transport_key = _ed25519_key(body.transport_key, "transport_key")
    check_root_policy(schema, body.attribute, identity.policy)
    epoch = target_epoch(state, body.epoch)
    charge_keys(state, caller, 1)
    expires_at = int(epoch.end + epoch.grace)
    out = await answer(state, caller.name, root_credential(schema.attribute(body.attribute)),
                       transport_key, epoch, expires_at)
    await _audited(state, caller, "issue_root", epoch.number,
                   {"identity": identity.name, "role": "root", "attribute": body.attribute,
                    "transport_key": body.transport_key})
    return {"epoch": epoch.number, "epoch_end": epoch.end, "attribute": body.attribute,
            "transport_key": body.transport_key, "expires_at": expires_at} | out


@router.post("/root", response_model=RootCertificate,
             responses=error_responses(401, 403, 409, 422))
async def enrol_root(body: RootEnrolment, caller: AnIdentity,
                     state: State) -> dict[str, Any]:
    """Certify a root peer's Ed25519 transport key for one attribute tree
    (``credentials.certificates.root_certificate_message`` is what is signed)."""
    single_server_only(state, "root certificates")
    return await enrol_root_with(state, caller, body, _root_certificate)


async def _root_certificate(state: AppState, who: str, credential: Credential,
                            transport_key: bytes, epoch: Epoch, expires_at: int
                            ) -> dict[str, Any]:
    certificate = SignedRootCertificate.issue(state.store.signing_key, credential.attribute,
                                              transport_key, epoch.number, expires_at).signature
    token = await state.issuer.root_token(who, epoch.number, credential)
    state.metrics.keys_issued("root_certificate", 1)
    state.metrics.keys_issued("routing_token", 1)
    return {"certificate": base64.b64encode(certificate).decode(), "routing_token": token}


def _check_addresses(state: AppState, addresses: list[str]) -> None:
    check_canonical(addresses, "addresses")
    if len(set(addresses)) != len(addresses):
        raise ApiError(422, "addresses: an address is listed twice", "duplicate_address")
    cap = state.config.max_peer_addresses
    if len(addresses) > cap:
        raise ApiError(422, f"addresses: this server certifies at most {cap} addresses per "
                       "identity", "too_many_addresses")


def _claim_and_record(state: AppState, identity: Identity, addresses: list[str], now: float,
                      not_after: float, epoch: int, detail: dict[str, Any]) -> None:
    """Make the addresses the identity's and audit the issuance, in one transaction."""
    with state.sessions.begin() as session:
        claim_addresses(session, identity.id, addresses, now, not_after,
                        state.config.max_peer_addresses)
        audit(session, identity.name, "issue_transport", epoch, detail)


@router.get("/transport", response_model=HeldAddressesOut,
            responses=error_responses(401, 403))
def held_transport_addresses(caller: AnIdentity, state: State) -> dict[str, Any]:
    """The addresses certified to the caller's identity and still live, for its own peers
    only (no identity sees another's): a peer restarted without a fixed port takes one of
    them again, so restarts do not use up the cap."""
    identity = caller.identity
    assert identity is not None
    with state.sessions() as session:
        held = held_addresses(session, identity.id, time.time())
    return {"addresses": [{"address": a, "expires_at": until} for a, until in held]}


LinkAnswer = Callable[[AppState, bytes, PeerBinding, float, Epoch],
                     Awaitable[tuple[float, dict[str, Any], str]]]
"""What a link-key enrolment answers for (key, binding, now, epoch): version 2's X.509
certificate or a threshold member's partial signature; with the end of its validity and the
kind of key it counts as issued."""


async def enrol_transport_with(state: AppState, caller: Caller, body: TransportEnrolment,
                               answer: LinkAnswer) -> dict[str, Any]:
    """The pipeline of every link-key enrolment, version 2's and a threshold member's: the
    key and addresses checked, the epoch, one key charged, the binding (for a root, the
    trees its policy leaves whole) answered for, then the addresses claimed and the
    issuance audited in one transaction."""
    identity = caller.identity
    assert identity is not None
    raw_key = _ed25519_key(body.public_key, "public_key")
    _check_addresses(state, body.addresses)
    now = time.time()
    epoch = target_epoch(state, "next" if body.epoch == "next" else None, now)
    attributes = (root_attributes(state.store.schema, identity.policy)
                  if identity.role == "root" else ())
    charge_keys(state, caller, 1)
    binding = PeerBinding(identity.name, identity.role, tuple(body.addresses), attributes,
                          epoch.number)
    not_after, out, kind = await answer(state, raw_key, binding, now, epoch)
    claim = (state, identity, body.addresses, now, not_after, epoch.number,
             {"identity": identity.name, "role": identity.role, "addresses": body.addresses,
              "attributes": list(attributes), "key_fingerprint": fingerprint(raw_key),
              "not_after": not_after})
    try:
        await run_in_threadpool(_claim_and_record, *claim)
    except IntegrityError:  # a concurrent first claim of an address won the insert
        await run_in_threadpool(_claim_and_record, *claim)
    state.metrics.keys_issued(kind, 1)
    return {"epoch": epoch.number, "epoch_end": epoch.end, "not_after": not_after,
            "identity": identity.name, "role": identity.role, "addresses": body.addresses,
            "attributes": list(attributes)} | out


@router.post("/transport", response_model=TransportCertificateOut,
             responses=error_responses(401, 403, 409, 422))
async def enrol_transport(body: TransportEnrolment, caller: AnIdentity,
                          state: State) -> dict[str, Any]:
    """Certify a peer's Ed25519 link key (X.509 from the peer-link CA) for the identity, its
    role, the addresses it listens on and, for a root, the trees its policy leaves whole,
    until the epoch's end plus grace. The addresses become the identity's own until the
    certificate expires (409 ``address_taken`` while another identity's certificate names
    one); 409 ``too_many_addresses`` if the identity would then hold more live addresses
    than the server's cap (re-certifying the ones it holds always works)."""
    single_server_only(state, "peer-link certificates")
    return await enrol_transport_with(state, caller, body, _link_certificate)


async def _link_certificate(state: AppState, raw_key: bytes, binding: PeerBinding, now: float,
                            epoch: Epoch) -> tuple[float, dict[str, Any], str]:
    certificate = issue_peer_certificate(state.store.peer_ca.key,
                                         Ed25519PublicKey.from_public_bytes(raw_key), binding,
                                         now, epoch.end + epoch.grace)
    return (certificate.not_valid_after_utc.timestamp(), {"certificate": to_pem(certificate)},
            "peer_certificate")
