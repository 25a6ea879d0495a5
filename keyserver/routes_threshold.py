"""A threshold deployment's member (docs/scheme.md section 16): its public outcome, and its
shares of an identity's keys. The enrolment pipeline is version 2's (the identity's token
and policy at this server, the same decomposition, charging and audit); only the answer
differs: this member's shares, which a client checks and combines with those of ``t - 1``
other members (``keyserver.threshold_client``). On a single key server these routes
answer 404 ``not_threshold``."""

from __future__ import annotations

import asyncio
import base64
import functools
from typing import Any

from fastapi import APIRouter

from ibe_pubsub.credentials import (
    G2,
    Credential,
    GroupError,
    PeerBinding,
    peer_link_message,
    scheme,
)
from ibe_pubsub.keyserver.api_models import (
    LinkSignatureOut,
    MembersOut,
    PublisherShareEnrolment,
    PublisherSharesOut,
    RootShareEnrolment,
    RootSharesOut,
    SubscriberShareEnrolment,
    SubscriberShareOut,
    ThresholdOut,
    ThresholdSchemaOut,
    TransportEnrolment,
)
from ibe_pubsub.keyserver.auth import AnIdentity, State
from ibe_pubsub.keyserver.enrolment import labels, target_epoch
from ibe_pubsub.keyserver.epochs import Epoch
from ibe_pubsub.keyserver.errors import ApiError, error_responses
from ibe_pubsub.keyserver.routes_enrol import (
    decoded_bytes,
    enrol_keys,
    enrol_root_with,
    enrol_transport_with,
    publisher_plan,
    subscriber_plan,
)
from ibe_pubsub.keyserver.state import AppState
from ibe_pubsub.keyserver.threshold_store import ThresholdMember, public_document

router = APIRouter(prefix="/v3", tags=["threshold"])


def _member(state: AppState) -> ThresholdMember:
    if state.member is None:
        raise ApiError(404, "this key server is a single (version-2) key server, not a member "
                       "of a threshold deployment: use /v1/enrol", "not_threshold")
    return state.member


async def issue_shares(state: AppState, who: str, role: str, epoch: Epoch,
                       credentials: list[Credential], fine: list[Credential],
                       request_seed: bytes | None = None,
                       request_binding: bytes = b"") -> dict[str, Any]:
    """This member's shares for one enrolment, in the /v3 response shape (``Issue``); with a
    subscriber's ``request_seed``, its partial signatures of the connection requests every
    member derives from that seed."""
    expires_at = int(epoch.end + epoch.grace)
    base: dict[str, Any] = {"index": _member(state).index, "identity": who,
                            "epoch": epoch.number, "epoch_end": epoch.end,
                            "expires_at": expires_at, "credentials": labels(credentials)}
    if role == "publisher":
        shares = await state.issuer.publisher_shares(who, epoch.number, credentials)
        state.metrics.keys_issued("publisher_share", len(credentials))
        return base | {"shares": shares}
    share_job = state.issuer.subscriber_share(who, epoch.number, credentials, fine)
    signatures: list[dict[str, str]] = []
    if request_seed is None:
        share = await share_job
    else:
        share, signatures = await asyncio.gather(share_job, state.issuer.request_signatures(
            who, epoch.number, credentials, expires_at, request_seed, request_binding))
    state.metrics.keys_issued("subscriber_credential_share", len(credentials))
    state.metrics.keys_issued("routing_token_share", len(fine))
    state.metrics.keys_issued("connection_request_signature", len(signatures))
    return base | {"fine_credentials": labels(fine), "share": share,
                   "request_signatures": signatures}


@router.get("/threshold", response_model=ThresholdOut, responses=error_responses(404))
def threshold(state: State) -> dict[str, Any]:
    """The deployment's public outcome (the same ``threshold.json`` at every member) and
    this member's index. A client pins the fingerprint it got from the operators."""
    member = _member(state)
    return public_document(member.plan, member.public_key) | {
        "index": member.index, "n": member.plan.n}


@router.get("/schema", response_model=ThresholdSchemaOut, response_model_by_alias=True,
            responses=error_responses(404))
def schema(state: State) -> dict[str, Any]:
    """The schema this member was initialised with and its partial signature of it (tag
    21, made once): a client takes the schema that ``t`` members signed, checked against
    the deployment's signing key ``X``, instead of trusting any one member."""
    member, schema = _member(state), state.store.schema
    return {"index": member.index, "schema": schema.to_dict(), "schema_id": schema.id,
            "signature": state.schema_signature}


@router.post("/enrol/subscriber", response_model=SubscriberShareOut,
             responses=error_responses(401, 403, 404, 409, 422))
async def enrol_subscriber_share(body: SubscriberShareEnrolment, caller: AnIdentity,
                                 state: State) -> dict[str, Any]:
    """This member's share of the keys for a subscription inside the identity's policy
    here, and with a ``request_seed`` its signatures of the connection requests derived
    from it. Asking again for the same subscription in the same epoch returns the same
    share."""
    _member(state)
    seed, binding = _request_seed(state, body)
    return await enrol_keys(state, caller, "subscriber", "subscription", body.subscription,
                            target_epoch(state, body.epoch), subscriber_plan(body),
                            functools.partial(issue_shares, request_seed=seed,
                                              request_binding=binding))


def _request_seed(state: AppState, body: SubscriberShareEnrolment) -> tuple[bytes | None,
                                                                             bytes]:
    """The seed and the binding ``V`` (checked: a G2 point of the group; strict decoding
    refuses the identity, which would bind nothing), or 422."""
    if body.request_seed is None:
        if body.request_binding is not None:
            raise ApiError(422, "request_binding comes with a request_seed", "invalid_seed")
        return None, b""
    seed = decoded_bytes(body.request_seed, "request_seed", scheme.REQUEST_SEED_BYTES,
                         "32 random bytes", "invalid_seed")
    group = state.store.group
    if body.request_binding is None:
        raise ApiError(422, "a request_seed needs its request_binding", "invalid_seed")
    binding = decoded_bytes(body.request_binding, "request_binding", group.sizes[G2],
                            "a compressed G2 point", "invalid_seed")
    try:
        group.deserialize(G2, binding)
    except GroupError as exc:
        raise ApiError(422, f"request_binding is not a point of G2: {exc}",
                       "invalid_seed") from exc
    return seed, binding


@router.post("/enrol/publisher", response_model=PublisherSharesOut,
             responses=error_responses(401, 403, 404, 409, 422))
async def enrol_publisher_shares(body: PublisherShareEnrolment, caller: AnIdentity,
                                 state: State) -> dict[str, Any]:
    """This member's shares of the publisher keys for an advertisement inside the
    identity's policy here."""
    _member(state)
    return await enrol_keys(state, caller, "publisher", "advertisement", body.advertisement,
                            target_epoch(state, body.epoch), publisher_plan(body),
                            issue_shares)



@router.post("/enrol/root", response_model=RootSharesOut,
             responses=error_responses(401, 403, 404, 409, 422))
async def enrol_root_shares(body: RootShareEnrolment, caller: AnIdentity,
                            state: State) -> dict[str, Any]:
    """This member's partial signature of a root peer's certificate (the message version
    2's server signs with Ed25519) and its share of the root's whole-domain routing token,
    under the same checks as ``/v1/enrol/root``."""
    member = _member(state)
    return {"index": member.index, "identity": caller.name} | await enrol_root_with(
        state, caller, body, _root_shares)


async def _root_shares(state: AppState, who: str, credential: Credential,
                       transport_key: bytes, epoch: Epoch, expires_at: int
                       ) -> dict[str, Any]:
    shares = await state.issuer.root_shares(who, epoch.number, credential, transport_key,
                                            expires_at)
    state.metrics.keys_issued("root_certificate_signature", 1)
    state.metrics.keys_issued("routing_token_share", 1)
    return shares


@router.post("/enrol/transport", response_model=LinkSignatureOut,
             responses=error_responses(401, 403, 404, 409, 422))
async def enrol_link_signature(body: TransportEnrolment, caller: AnIdentity,
                               state: State) -> dict[str, Any]:
    """This member's signature, with its own member key, of a peer's Ed25519 link key with
    its binding (the identity, its role, the addresses it listens on, for a root the trees
    its policy leaves whole, the epoch) and expiry, under the same checks and address
    claims as ``/v1/enrol/transport``: those of a quorum of members make the certificate
    peers check after the TLS handshake."""
    member = _member(state)
    return {"index": member.index, "public_key": body.public_key} | await enrol_transport_with(
        state, caller, body, _link_signature)


async def _link_signature(state: AppState, link_key: bytes, binding: PeerBinding, _now: float,
                          epoch: Epoch) -> tuple[float, dict[str, Any], str]:
    """Signed with this member's own key, not its share of ``x``: what a certificate must
    show is that a quorum of members consented, and partial signatures of any ``t`` members
    determine every other member's (``credentials.threshold.encode_quorum_signature``)."""
    member, not_after = _member(state), int(epoch.end + epoch.grace)
    signature = member.signing_key.sign(member.scope + peer_link_message(
        link_key, binding.to_bytes(), not_after))
    return not_after, {"signature": base64.b64encode(signature).decode()}, "peer_link_signature"


@router.get("/members", response_model=MembersOut, responses=error_responses(404))
def members(state: State) -> dict[str, Any]:
    """Every member's own Ed25519 key (as ``threshold.json`` lists them) and this member's
    partial signature of them (tag 21, made once): a client takes the keys ``t`` members
    signed, under ``X``, to check the peer-link certificates a quorum of them signed."""
    member = _member(state)
    return {"index": member.index,
            "members": [{"index": i, "key": base64.b64encode(key).decode()}
                        for i, key in sorted(member.member_keys.items())],
            "signature": state.members_signature}
