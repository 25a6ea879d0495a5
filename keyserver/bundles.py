"""Decoding key-server responses into library objects, checking what can be checked.

``decode_params`` verifies the schema's id and the key server's signatures on it and on
the peer-link CA, so a peer that pins the server key (or trusts it on first use) cannot be
fed another schema or another CA; ``decode_transport_certificate`` checks a peer-link
certificate against that CA and the peer's own key; ``decode_bulk_bundle`` checks that a
bundle of bulk issuance is the key server's, whole.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ibe_pubsub.credentials import (
    ConnectionRequest,
    Credential,
    Ed25519Server,
    PairingGroup,
    PeerCertificate,
    PeerCertificateError,
    PublicParams,
    PublisherKey,
    RootCertificate,
    RoutingToken,
    Schema,
    ServerVerifier,
    SubscriberKey,
    decode_mpk,
    decode_publisher_key,
    decode_request,
    decode_routing_token,
    decode_subscriber_key,
    fingerprint,
    read_peer_certificate,
    verify_bundle,
    verify_peer_ca,
    verify_schema,
)
from ibe_pubsub.keyserver.exceptions import KeyServerError


class BundleError(KeyServerError, ValueError):
    """A response does not decode, or a signature in it does not verify."""


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


@dataclass(frozen=True)
class ServerParams:
    pp: PublicParams
    server_key: bytes
    schema_signature: bytes
    epoch: int
    epoch_start: float
    epoch_end: float
    epoch_length: int
    grace: int
    peer_ca: str
    """PEM of the peer-link CA certificate, signed by the server key."""

    @property
    def server(self) -> Ed25519Server:
        """The verifier of everything this key server signs."""
        return Ed25519Server(self.server_key)


@dataclass(frozen=True)
class TransportCertificate:
    """A peer-link certificate checked against the CA and the peer's key, and its binding."""

    pem: str
    certificate: PeerCertificate


@dataclass(frozen=True)
class IssuedRequest:
    """A signed connection request for one credential, and its SW per position."""

    attribute: str
    credential: Credential
    request: ConnectionRequest
    secrets: tuple[bytes, ...]


@dataclass(frozen=True)
class SubscriberBundle:
    epoch: int
    epoch_end: float
    expires_at: int
    credentials: dict[str, tuple[Credential, ...]]
    key: SubscriberKey
    requests: tuple[IssuedRequest, ...]


@dataclass(frozen=True)
class PublisherBundle:
    epoch: int
    epoch_end: float
    credentials: dict[str, tuple[Credential, ...]]
    keys: tuple[PublisherKey, ...]


@dataclass(frozen=True)
class BulkBundle:
    """One identity's keys from bulk issuance, signed by the key server; ``token`` is the
    identity's if bulk issuance created it (None: it has a token of its own)."""

    identity: str
    role: str
    token: str | None
    keys: SubscriberBundle | PublisherBundle


def _credentials(doc: dict[str, list[str]]) -> dict[str, tuple[Credential, ...]]:
    return {a: tuple(Credential.from_label(label) for label in labels)
            for a, labels in doc.items()}


def _certificate(pem: Any, what: str) -> x509.Certificate:
    if not isinstance(pem, str):
        raise BundleError(f"{what} is not PEM text")
    try:
        return x509.load_pem_x509_certificate(pem.encode("utf-8"))
    except ValueError as exc:
        raise BundleError(f"{what} does not decode: {exc}") from exc


def decode_params(group: PairingGroup, doc: dict[str, Any],
                  server_key: bytes | None = None) -> ServerParams:
    """Public parameters; ``server_key`` pins the expected Ed25519 key if given."""
    try:
        schema = Schema.from_dict(doc["schema"])
        key = _b64(doc["server_key"])
        signature = _b64(doc["schema_signature"])
        ca_signature = _b64(doc["peer_ca_signature"])
        mpk = decode_mpk(group, _b64(doc["mpk"]))
        out = ServerParams(PublicParams(group, mpk, schema), key, signature, int(doc["epoch"]),
                           float(doc["epoch_start"]), float(doc["epoch_end"]),
                           int(doc["epoch_length"]), int(doc["grace"]), doc["peer_ca"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"public parameters do not decode: {exc}") from exc
    if server_key is not None and key != server_key:
        raise BundleError(f"the key server presents signing key {fingerprint(key)}, not the "
                          f"pinned {fingerprint(server_key)} (--server-key)")
    if schema.id != doc.get("schema_id"):
        raise BundleError("schema id does not match the schema")
    if not verify_schema(out.server, schema, signature):
        raise BundleError("the schema signature does not verify")
    ca_der = _certificate(out.peer_ca, "the peer-link CA").public_bytes(
        serialization.Encoding.DER)
    if not verify_peer_ca(out.server, ca_der, ca_signature):
        raise BundleError("the peer-link CA signature does not verify")
    return out


def decode_transport_certificate(doc: dict[str, Any], params: ServerParams,
                                 public_key: bytes) -> TransportCertificate:
    """A peer-link certificate (``POST /v1/enrol/transport``), after checking that the CA of
    ``params`` issued it and that it certifies exactly ``public_key`` (raw Ed25519)."""
    pem = doc.get("certificate") if isinstance(doc, dict) else None
    certificate = _certificate(pem, "the peer-link certificate")
    try:
        certificate.verify_directly_issued_by(_certificate(params.peer_ca, "the peer-link CA"))
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise BundleError("the peer-link certificate is not issued by the key server's "
                          f"peer-link CA ({exc or type(exc).__name__})") from exc
    certified = certificate.public_key()
    if not isinstance(certified, Ed25519PublicKey) or certified.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw) != public_key:
        raise BundleError("the peer-link certificate certifies another key")
    try:
        return TransportCertificate(pem, read_peer_certificate(certificate))
    except PeerCertificateError as exc:
        raise BundleError(f"the peer-link certificate binds no peer: {exc}") from exc


def decode_subscriber_bundle(group: PairingGroup, doc: dict[str, Any]) -> SubscriberBundle:
    try:
        requests = tuple(IssuedRequest(
            r["attribute"], Credential.from_label(r["credential"]),
            decode_request(group, _b64(r["request"])),
            tuple(_b64(s) for s in r["secrets"])) for r in doc["connection_requests"])
        return SubscriberBundle(int(doc["epoch"]), float(doc["epoch_end"]),
                                int(doc["expires_at"]), _credentials(doc["credentials"]),
                                decode_subscriber_key(group, _b64(doc["subscriber_key"])),
                                requests)
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"subscriber bundle does not decode: {exc}") from exc


def decode_publisher_bundle(group: PairingGroup, doc: dict[str, Any]) -> PublisherBundle:
    try:
        return PublisherBundle(int(doc["epoch"]), float(doc["epoch_end"]),
                               _credentials(doc["credentials"]),
                               tuple(decode_publisher_key(group, _b64(k))
                                     for k in doc["publisher_keys"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"publisher bundle does not decode: {exc}") from exc


def decode_bulk_bundle(params: ServerParams, doc: Any) -> BulkBundle:
    """A bundle written by ``bulk issue``, after checking that the key server of ``params``
    signed it as it is, for its schema."""
    if not isinstance(doc, dict) or not {"identity", "role", "signature"} <= doc.keys():
        raise BundleError("it is not a signed bundle of `bulk issue`")
    try:
        server_key, signature = _b64(doc["server_key"]), _b64(doc["signature"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"its server key or signature does not decode: {exc}") from exc
    if server_key != params.server_key:
        raise BundleError(f"another key server issued it (key {fingerprint(server_key)}; "
                          f"this one's is {fingerprint(params.server_key)})")
    if not verify_bundle(params.server, doc, signature):
        raise BundleError("the key server's signature does not verify: the bundle was "
                          "altered since it was issued")
    if doc.get("schema_id") != params.pp.schema.id:
        raise BundleError("it was issued for another schema than the key server's")
    token, role = doc.get("token"), doc["role"]
    keys = (decode_subscriber_bundle(params.pp.group, doc) if role == "subscriber"
            else decode_publisher_bundle(params.pp.group, doc))
    return BulkBundle(doc["identity"], role, token, keys)


def decode_root_token(group: PairingGroup, doc: dict[str, Any], credential: Credential,
                      epoch: int) -> RoutingToken:
    """The root's whole-domain routing token; it must be for ``credential`` and ``epoch``."""
    try:
        token = decode_routing_token(group, _b64(doc["routing_token"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"root routing token does not decode: {exc}") from exc
    if token.credential != credential or token.epoch != epoch:
        raise BundleError("the root routing token is not for this tree and epoch")
    return token


def decode_root_certificate(doc: dict[str, Any], server: ServerVerifier) -> RootCertificate:
    """The certificate, after checking the key service's signature on it."""
    try:
        cert = RootCertificate(doc["attribute"], _b64(doc["transport_key"]), int(doc["epoch"]),
                               int(doc["expires_at"]), _b64(doc["certificate"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"root certificate does not decode: {exc}") from exc
    if not cert.verify(server):
        raise BundleError("the root certificate's signature does not verify")
    return cert
