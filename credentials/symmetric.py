"""The symmetric primitives of docs/scheme.md: H4, KDF and the AEAD (from `cryptography`)."""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import Element, PairingGroup

NONCE_BYTES = 12
#: Prepended to every KDF ``info``: keys of this scheme version never serve another.
KDF_PREFIX = b"IBE-PUBSUB-V2/"


class AuthenticationFailed(CredentialsError, ValueError):
    """AEAD opening failed: wrong key or tampered bytes."""


def H4(x: Element) -> bytes:
    """H4(x) = SHA-256("tag" || ser(x)), x in GT: the routing tag. The prefix keeps it apart
    from the KDF outputs derived from the same position key."""
    return hashlib.sha256(b"tag" + bytes(x)).digest()


def KDF(x: Element, info: bytes, length: int = 32) -> bytes:
    """KDF(x, info) = HKDF-SHA256(ikm = ser(x), no salt, info = KDF_PREFIX || info)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                info=KDF_PREFIX + info).derive(bytes(x))


def _parts(parts: tuple[bytes, ...]) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def prf_scalar(group: PairingGroup, key: bytes, *parts: bytes) -> int:
    """``PRF(key; parts)`` in Zq*: HMAC-SHA512 over the length-prefixed parts, reduced (64
    bytes for a 255-bit order, so the bias is below 2^-256)."""
    digest = hmac.new(key, _parts(parts), hashlib.sha512).digest()
    return int.from_bytes(digest, "big") % (group.order - 1) + 1


def prf_bytes(key: bytes, length: int, *parts: bytes) -> bytes:
    """``length`` bytes of ``PRF(key; parts)``: HKDF-SHA256 expanded from ``key`` with the
    length-prefixed parts as ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                info=KDF_PREFIX + b"prf/" + _parts(parts)).derive(key)


def seal(key: bytes, plaintext: bytes, associated_data: bytes, nonce: bytes | None = None
         ) -> bytes:
    """ChaCha20-Poly1305 under ``key`` with a random nonce (or the one given), prepended to
    the ciphertext. Every key here seals once, so a nonce never repeats under a key."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
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
