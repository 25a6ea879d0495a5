"""What the key server signs with its Ed25519 key besides connection requests.

* The schema: ``tag || schema.canonical_bytes()``, so peers trust the event space.
* Root certificates: a root peer holds no D/S1/S2 (docs/scheme.md), so it proves that it
  accepted a connection request by signing with a transport key the key server
  certified for one attribute tree, one epoch, until an expiry.
* The peer-link CA certificate (:mod:`credentials.peer_certificates`), so peers take the
  CA from the public parameters under the key they already trust.
* Bundles of bulk issuance: a peer that takes its keys from a file can tell a bundle of
  this key server, whole, from one of another server or one altered since.
* Peer-link bindings, in a threshold deployment only (version 3): a quorum of members
  signs a peer's link key with its binding (identity, role, addresses, epoch) and expiry,
  where
  version 2's peer-link CA signs an X.509 certificate (:mod:`credentials.peer_certificates`).

Every signed message starts with its own domain tag and length-prefixes each field,
so a signature over one kind of message can never pass for another.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.schema import Schema
from ibe_pubsub.credentials.server_keys import ServerVerifier

SCHEMA_TAG = b"ibe-pubsub/v1/schema"
ROOT_TAG = b"ibe-pubsub/v1/root-certificate"
PEER_CA_TAG = b"ibe-pubsub/v2/peer-link-ca"
BUNDLE_TAG = b"ibe-pubsub/v1/bulk-bundle"
PEER_LINK_TAG = b"ibe-pubsub/v3/peer-link-binding"


class CertificateError(CredentialsError, ValueError):
    """A root certificate, or a transport key for one, that is not well formed."""


ED25519_KEY_BYTES = 32


def fingerprint(key: bytes) -> str:
    """SHA-256 of a raw public key in unpadded base64, as SSH shows host keys."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key).digest()).decode().rstrip("=")


def _fields(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def schema_message(schema: Schema) -> bytes:
    """The bytes the key server signs to vouch for a schema."""
    return _fields(SCHEMA_TAG, schema.canonical_bytes())


def verify_schema(server: ServerVerifier, schema: Schema, signature: bytes) -> bool:
    """True iff ``signature`` is the key service's signature of ``schema``."""
    return server.verify(schema_message(schema), signature)


def peer_ca_message(ca_der: bytes) -> bytes:
    """tag || the DER of the peer-link CA certificate."""
    return _fields(PEER_CA_TAG, ca_der)


def verify_peer_ca(server: ServerVerifier, ca_der: bytes, signature: bytes) -> bool:
    """True iff the key service signed this peer-link CA certificate."""
    return server.verify(peer_ca_message(ca_der), signature)


def bundle_message(bundle: Mapping[str, Any]) -> bytes:
    """tag || the canonical JSON (sorted keys, no blanks, ASCII) of a bulk-issuance bundle
    without its ``signature`` field."""
    body = {k: v for k, v in bundle.items() if k != "signature"}
    return _fields(BUNDLE_TAG, json.dumps(body, sort_keys=True, separators=(",", ":"))
                   .encode("ascii"))


def verify_bundle(server: ServerVerifier, bundle: Mapping[str, Any], signature: bytes) -> bool:
    """True iff the key service signed this bundle as it is."""
    return server.verify(bundle_message(bundle), signature)


def peer_link_message(link_key: bytes, binding: bytes, not_after: int) -> bytes:
    """tag || link key (raw Ed25519, 32 bytes) || the peer binding's canonical bytes ||
    not_after (u64): what a quorum of a threshold deployment's members signs where version
    2's peer-link CA signs a certificate."""
    if len(link_key) != ED25519_KEY_BYTES:
        raise CertificateError("a link key is a raw 32-byte Ed25519 public key")
    return _fields(PEER_LINK_TAG, link_key, binding, int(not_after).to_bytes(8, "big"))


def root_certificate_message(attribute: str, transport_key: bytes, epoch: int,
                             expires_at: int) -> bytes:
    """tag || attribute || transport key (32 bytes) || epoch (u64) || expires_at (u64)."""
    if len(transport_key) != ED25519_KEY_BYTES:
        raise CertificateError("a transport key is a raw 32-byte Ed25519 public key")
    return _fields(ROOT_TAG, attribute.encode("utf-8"), transport_key,
                   epoch.to_bytes(8, "big"), int(expires_at).to_bytes(8, "big"))


@dataclass(frozen=True)
class RootCertificate:
    """The key server's signature over a root's transport key; travels as a msgpack array."""

    attribute: str
    transport_key: bytes
    epoch: int
    expires_at: int
    signature: bytes

    @classmethod
    def issue(cls, signing_key: Ed25519PrivateKey, attribute: str, transport_key: bytes,
              epoch: int, expires_at: int) -> RootCertificate:
        message = root_certificate_message(attribute, transport_key, epoch, expires_at)
        return cls(attribute, transport_key, epoch, expires_at, signing_key.sign(message))

    def verify(self, server: ServerVerifier, attribute: str | None = None,
               now: float | None = None) -> bool:
        """True iff the key service signed it (for ``attribute`` and unexpired at ``now``,
        when given)."""
        if attribute is not None and attribute != self.attribute:
            return False
        if now is not None and now > self.expires_at:
            return False
        try:
            message = root_certificate_message(self.attribute, self.transport_key, self.epoch,
                                               self.expires_at)
        except ValueError:
            return False
        return server.verify(message, self.signature)

    def to_bytes(self) -> bytes:
        return msgpack.packb([self.attribute, self.transport_key, self.epoch, self.expires_at,
                              self.signature], use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> RootCertificate:
        try:
            a, k, e, x, s = msgpack.unpackb(data, raw=False)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
            raise CertificateError(f"malformed root certificate: {exc}") from None
        if not (isinstance(a, str) and isinstance(k, bytes) and isinstance(e, int)
                and isinstance(x, int) and isinstance(s, bytes)):
            raise CertificateError("malformed root certificate fields")
        return cls(a, k, e, x, s)
