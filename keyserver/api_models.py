"""Request and response bodies of the HTTP API (pydantic; they make /openapi.json).

Keys travel as standard padded base64 of the ``credentials.codec`` encodings.
Unknown fields in requests are rejected (422), so typos do not pass silently, and so is
every string that is no text (see ``Text``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ibe_pubsub.credentials import MAX_ADDRESSES
from ibe_pubsub.keyserver.exceptions import KeyServerError

MAX_PREDICATE = 4096
#: The most credentials, and fine credentials, one enrolment decomposes into (422 beyond,
#: keyserver.enrolment); clients of a threshold deployment bound members' answers by them.
MAX_CREDENTIALS, MAX_FINE_CREDENTIALS = 256, 4096
#: Neighbours one directory registration may vouch for.
MAX_SEEN = 32
_NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


class TextError(KeyServerError, ValueError):
    """A request string that is not text; the API answers it with 422."""


def _text(value: Any) -> Any:
    """Refuse lone UTF-16 surrogates (JSON can carry them, UTF-8 cannot: hashing, the
    database and the JSON answer would fail) and control characters other than tab and
    line breaks (PostgreSQL refuses NUL; none belongs in a name, address or predicate)."""
    if isinstance(value, str) and (bad := _NOT_TEXT.search(value)):
        kind = "lone UTF-16 surrogate" if bad.group() >= "\ud800" else "control character"
        raise TextError(f"{kind} {bad.group()!r} at position {bad.start()} is not text")
    return value


Text = Annotated[str, BeforeValidator(_text)]
"""Every string the API accepts: a ``str`` that is valid text."""

Name = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@:+-]+$")
Address = Annotated[Text, Field(min_length=3, max_length=300, pattern=r"^[^\s/]+:[0-9]{1,5}$",
                                description="host:port in canonical form "
                                "(credentials.peer_certificates.canonical_address)")]
Role = Literal["subscriber", "publisher", "root"]


class Strict(BaseModel):
    """A request body: unknown fields and lax coercions (``"2"`` or ``2.0`` for an integer,
    ``"true"`` or ``1`` for a boolean) are refused, so the server accepts exactly what
    /openapi.json describes."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorDetail(BaseModel):
    status: int
    code: str
    message: str
    detail: Any = Field(default=None, description="structured data, e.g. the policy clause")


class ErrorOut(BaseModel):
    """Every error answer (keyserver.errors)."""

    error: ErrorDetail


# -- public ---------------------------------------------------------------------------------

class PublicParamsOut(BaseModel):
    curve: str
    mpk: str
    schema_: dict[str, Any] = Field(alias="schema")
    schema_id: str
    schema_signature: str
    server_key: str
    peer_ca: str = Field(description="PEM of the peer-link CA certificate")
    peer_ca_signature: str = Field(description="base64 Ed25519 signature of the server key "
                                   "over credentials.certificates.peer_ca_message(DER)")
    epoch: int
    epoch_start: float
    epoch_end: float
    epoch_length: int
    grace: int

    model_config = ConfigDict(populate_by_name=True)


class SchemaOut(BaseModel):
    schema_: dict[str, Any] = Field(alias="schema")
    schema_id: str
    schema_signature: str
    server_key: str

    model_config = ConfigDict(populate_by_name=True)


class EpochOut(BaseModel):
    epoch: int
    epoch_start: float
    epoch_end: float
    epoch_length: int
    grace: int
    in_grace: bool


class Health(BaseModel):
    status: Literal["ok"]
    epoch: int


# -- admin ----------------------------------------------------------------------------------

class IdentityIn(Strict):
    name: Text = Name
    role: Role
    policy: Text | None = Field(default=None, max_length=MAX_PREDICATE)


class BulkIssuedOut(BaseModel):
    epoch: int
    credentials: dict[str, list[str]] = Field(description="credential labels per attribute")


class IdentityOut(BaseModel):
    id: int
    name: str
    role: Role
    policy: str | None
    created_at: float
    revoked_at: float | None
    revoked_epoch: int | None
    bulk_only: bool = Field(description="created by bulk issuance: it gets keys only that "
                            "way, so its policy is what it was issued, not ``policy``")
    bulk_issued: BulkIssuedOut | None = Field(
        default=None, description="its latest bulk issuance (in the listing; None if none)")


class IdentityCreated(BaseModel):
    id: int
    name: str
    role: Role
    policy: str | None
    token: str = Field(description="the identity's bearer token; shown only this once")


class AuditOut(BaseModel):
    id: int
    at: float
    actor: str
    action: str
    epoch: int | None
    detail: Any


# -- enrolment ------------------------------------------------------------------------------

class SubscriberEnrolment(Strict):
    subscription: Text = Field(max_length=MAX_PREDICATE,
                               description="predicate in the schema's language")
    fine_depth: int = Field(default=1, ge=0, le=4,
                            description="split depth of fine credentials (0: none)")
    max_credentials: int | None = Field(default=None, ge=1, le=64,
                                        description="cap per numeric attribute (coarsens)")
    epoch: Literal["next"] | None = Field(default=None, description='null or "next" (in grace)')


class PublisherEnrolment(Strict):
    advertisement: Text = Field(max_length=MAX_PREDICATE)
    max_credentials: int | None = Field(default=None, ge=1, le=64)
    epoch: Literal["next"] | None = None


class SubscriberShareEnrolment(SubscriberEnrolment):
    epoch: Literal["next"] | Annotated[int, Field(ge=0)] | None = Field(
        default=None, description='null (the current epoch), "next" (in grace) or the number '
        "of the current or next epoch")
    request_seed: Text | None = Field(
        default=None, max_length=64,
        description="base64 of 32 random bytes the client chose (the same at every member): "
        "the member derives each credential's connection request from it and returns its "
        "partial signature of it; null: no connection requests")
    request_binding: Text | None = Field(
        default=None, max_length=200,
        description="with request_seed: base64 of V = ĝ^s (a compressed G2 point, 96 bytes) "
        "for a secret s of the client's; each request carries V^h (h a PRF of the seed per "
        "credential), so that only a peer holding a covering token can prove it opened one")


class PublisherShareEnrolment(PublisherEnrolment):
    epoch: Literal["next"] | Annotated[int, Field(ge=0)] | None = None


class RootEnrolment(Strict):
    attribute: Text = Field(min_length=1, max_length=200)
    transport_key: Text = Field(min_length=1, max_length=64,
                                description="base64 raw Ed25519 public key (32 bytes)")
    epoch: Literal["next"] | None = None


class RootShareEnrolment(RootEnrolment):
    epoch: Literal["next"] | Annotated[int, Field(ge=0)] | None = None


class TransportEnrolment(Strict):
    public_key: Text = Field(min_length=1, max_length=64,
                             description="base64 raw Ed25519 public key (32 bytes)")
    addresses: list[Address] = Field(default=[], max_length=MAX_ADDRESSES,
                                     description="the addresses the peer listens on; they "
                                     "become the identity's own")
    epoch: Literal["current", "next"] | None = Field(
        default=None, description='null or "current"; "next" in the grace window')


class TransportCertificateOut(BaseModel):
    certificate: str = Field(description="PEM X.509 certificate from the peer-link CA")
    epoch: int
    epoch_end: float
    not_after: float = Field(description="end of validity (Unix time): epoch end + grace")
    identity: str
    role: Role
    addresses: list[str]
    attributes: list[str] = Field(description="trees a root may serve (others: none)")


class HeldAddressOut(BaseModel):
    address: str
    expires_at: float = Field(description="when the identity's latest certificate naming it "
                              "expires (Unix time)")


class HeldAddressesOut(BaseModel):
    addresses: list[HeldAddressOut] = Field(description="the caller's live certified "
                                            "addresses, latest expiry first")


class CallerOut(BaseModel):
    name: str
    role: Role
    bulk_only: bool = Field(description="receives keys only through bulk issuance (the "
                            "enrolment endpoints refuse it)")


class ConnectionRequestOut(BaseModel):
    attribute: str
    credential: str
    request: str
    secrets: list[str]


class SubscriberBundle(BaseModel):
    epoch: int
    epoch_end: float
    expires_at: int
    credentials: dict[str, list[str]]
    fine_credentials: dict[str, list[str]]
    subscriber_key: str
    connection_requests: list[ConnectionRequestOut]


class PublisherBundle(BaseModel):
    epoch: int
    epoch_end: float
    credentials: dict[str, list[str]]
    publisher_keys: list[str]


class RequestSignatureOut(BaseModel):
    attribute: str
    credential: str
    request: str = Field(description="base64 body (tag 22) of the connection request this "
                         "member derived from the request_seed and request_binding")
    signature: str = Field(description="base64 partial signature (tag 21) of that body")


class SubscriberShareOut(BaseModel):
    index: int = Field(description="this member's number in the deployment (1..n)")
    identity: str = Field(description="the identity the shares were issued to (the caller): "
                          "a client checks them under this name")
    epoch: int
    epoch_end: float
    expires_at: int
    credentials: dict[str, list[str]]
    fine_credentials: dict[str, list[str]]
    share: str = Field(description="base64 subscriber key share (wire format tag 19)")
    request_signatures: list[RequestSignatureOut] = Field(
        default=[], description="with a request_seed: each credential's connection request "
        "and this member's partial signature of it")


class PublisherSharesOut(BaseModel):
    index: int
    identity: str = Field(description="the identity the shares were issued to (the caller): "
                          "a client checks them under this name")
    epoch: int
    epoch_end: float
    expires_at: int = Field(description="when the keys may no longer sign (Unix time, whole "
                            "seconds): epoch end + grace")
    credentials: dict[str, list[str]]
    shares: list[str] = Field(description="base64 publisher key shares (tag 20), one per "
                                          "credential, in order")


class ThresholdOut(BaseModel):
    index: int
    deployment: str
    t: int
    n: int
    members: list[dict[str, str]]
    epoch_seconds: int = Field(description="the epoch length every member numbers epochs by")
    grace_seconds: int
    public_key: str = Field(description="base64 threshold public key (tag 18)")
    fingerprint: str


class ThresholdSchemaOut(BaseModel):
    index: int = Field(description="this member's number")
    schema_: dict[str, Any] = Field(alias="schema")
    schema_id: str
    signature: str = Field(description="base64 partial signature of the schema (tag 21), "
                                       "by this member's share of the signing key")


class RootCertificate(BaseModel):
    epoch: int
    epoch_end: float
    attribute: str
    transport_key: str
    certificate: str
    expires_at: int
    routing_token: str = Field(description="base64 routing token of the attribute's "
                                           "whole-domain credential (opens requests' entry 0)")


class RootSharesOut(BaseModel):
    index: int = Field(description="this member's number in the deployment (1..n)")
    identity: str = Field(description="the root identity the shares were issued to")
    epoch: int
    epoch_end: float
    attribute: str
    transport_key: str
    expires_at: int
    certificate: str = Field(description="base64 partial signature (tag 21) of the root "
                             "certificate's message: t of them combine into its signature")
    routing_token: str = Field(description="base64 share (tag 23) of the routing token of "
                               "the attribute's whole-domain credential")


class LinkSignatureOut(BaseModel):
    index: int = Field(description="this member's number in the deployment (1..n)")
    identity: str
    role: Role
    addresses: list[str]
    attributes: list[str] = Field(description="trees a root may serve (others: none)")
    epoch: int
    epoch_end: float
    not_after: int = Field(description="end of validity (Unix time, whole seconds): epoch "
                           "end + grace")
    public_key: str = Field(description="the link key signed for (base64, raw Ed25519)")
    signature: str = Field(description="base64 Ed25519 signature, with this member's own key, "
                           "of the link key, binding and expiry "
                           "(credentials.peer_link_message): those of a quorum of members "
                           "make the signature a peer's certificate carries (tag 24)")


class MemberKeyOut(BaseModel):
    index: int
    key: str = Field(description="base64 raw Ed25519 public key")


class MembersOut(BaseModel):
    index: int = Field(description="this member's number in the deployment (1..n)")
    members: list[MemberKeyOut]
    signature: str = Field(description="base64 partial signature (tag 21) of the member "
                           "keys (credentials.threshold.members_message)")


# -- bulk -----------------------------------------------------------------------------------

class BulkCredential(Strict):
    attribute: Text = Field(min_length=1, max_length=200)
    credential: Text = Field(min_length=1, max_length=300, description="Credential.label()")
    fine: bool = False
    position: int = Field(ge=0, le=1000)


class BulkItem(Strict):
    identity: Text = Name
    role: Literal["subscriber", "publisher"]
    credentials: list[BulkCredential] = Field(min_length=1, max_length=512)


class BulkIn(Strict):
    chunk_id: Text = Field(min_length=1, max_length=200)
    epoch: Literal["next"] | None = None
    items: list[BulkItem] = Field(min_length=1, max_length=2000)


class BulkOut(BaseModel):
    chunk_id: str
    epoch: int
    bundles: list[dict[str, Any]]


# -- directory ------------------------------------------------------------------------------

class DirectoryIn(Strict):
    address: Address
    attribute: Text = Field(min_length=1, max_length=200)
    role: Role
    ttl: int = Field(ge=1, le=86400, description="seconds (the lease ends with the address's "
                     "certificate at the latest)")
    seen: list[Address] = Field(default=[], max_length=MAX_SEEN,
                                description="neighbours in this tree that answered recently")


class DirectoryEntryOut(BaseModel):
    """An entry names no identity: lookups must not tell who constrains which attribute."""

    address: str
    role: Role
    expires_at: float
    vouched: bool = Field(description="a root, or a member another identity saw answering "
                          "recently")


class DirectoryOut(BaseModel):
    attribute: str
    roots: list[DirectoryEntryOut]
    members: list[DirectoryEntryOut] = Field(description="empty for a publisher, which sends "
                                             "to the roots alone")
