"""The symmetric primitives of SCHEME.md: H4, KDF and the AEAD, all from `cryptography`."""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from credentials.groups import Element

NONCE_BYTES = 12
KDF_PREFIX = b"ibe-pubsub/v1/kdf/"


class AuthenticationFailed(ValueError):
    """AEAD opening failed: wrong key or tampered bytes."""


def H4(x: Element) -> bytes:
    """H4(x) = SHA-256 of the canonical serialization of x in GT (the routing tag)."""
    return hashlib.sha256(bytes(x)).digest()


def KDF(x: Element, info: bytes) -> bytes:
    """KDF(x, info) = HKDF-SHA256 of the serialization of x in GT, 32 bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=KDF_PREFIX + info).derive(bytes(x))


def seal(key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """ChaCha20-Poly1305 under ``key`` with a random nonce, prepended to the ciphertext."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, associated_data)


def open_sealed(key: bytes, blob: bytes, associated_data: bytes) -> bytes:
    if len(blob) < NONCE_BYTES + 16:
        raise AuthenticationFailed("sealed data too short")
    try:
        return ChaCha20Poly1305(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:],
                                             associated_data)
    except InvalidTag as exc:
        raise AuthenticationFailed("authentication failed") from exc


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over length-prefixed parts."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(len(part).to_bytes(4, "big") + part)
    return h.digest()


def mac_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
