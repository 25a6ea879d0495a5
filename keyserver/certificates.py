"""What the key server signs with its Ed25519 key, and how peers check it.

Every signed message starts with a distinct domain tag and length-prefixes each
field, so a signature over one kind of message can never be replayed as another.

* Schema: ``tag || len || schema.canonical_bytes()``.
* Root certificate: ``tag || attribute || transport key (32 bytes) || epoch (u64)
  || expires_at (u64, Unix seconds)``, each field with a 4-byte big-endian length.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from credentials.schema import Schema

SCHEMA_TAG = b"ibe-pubsub/v1/schema"
ROOT_TAG = b"ibe-pubsub/v1/root-certificate"
ED25519_KEY_BYTES = 32


def _fields(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def schema_message(schema: Schema) -> bytes:
    """The bytes the key server signs to vouch for a schema."""
    return _fields(SCHEMA_TAG, schema.canonical_bytes())


def verify_schema(server_key: bytes, schema: Schema, signature: bytes) -> bool:
    """True iff ``signature`` is the key server's signature of ``schema``."""
    return _verify(server_key, schema_message(schema), signature)


def root_certificate_message(attribute: str, transport_key: bytes, epoch: int,
                             expires_at: int) -> bytes:
    """The bytes the key server signs to certify a root peer's Ed25519 transport key."""
    if len(transport_key) != ED25519_KEY_BYTES:
        raise ValueError("a transport key is a raw 32-byte Ed25519 public key")
    return _fields(ROOT_TAG, attribute.encode("utf-8"), transport_key,
                   epoch.to_bytes(8, "big"), int(expires_at).to_bytes(8, "big"))


def sign_root_certificate(signing_key: Ed25519PrivateKey, attribute: str, transport_key: bytes,
                          epoch: int, expires_at: int) -> bytes:
    return signing_key.sign(root_certificate_message(attribute, transport_key, epoch, expires_at))


def verify_root_certificate(server_key: bytes, attribute: str, transport_key: bytes, epoch: int,
                            expires_at: int, certificate: bytes, now: float | None = None) -> bool:
    """True iff the key server certified ``transport_key`` as root of ``attribute`` for
    ``epoch`` and, when ``now`` is given, the certificate has not expired."""
    if now is not None and now > expires_at:
        return False
    try:
        message = root_certificate_message(attribute, transport_key, epoch, expires_at)
    except ValueError:
        return False
    return _verify(server_key, message, certificate)


def _verify(server_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(server_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
