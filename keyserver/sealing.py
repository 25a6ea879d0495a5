"""Sealing the master secret at rest: AEAD under a key derived from a passphrase with scrypt.

The sealed file is a small JSON document naming the KDF and its parameters, so the
cost can be raised later without breaking old files. Those parameters are bounded
before use: the file is read before anything is authenticated, so a damaged one must not
make scrypt exhaust memory or time. A wrong passphrase and a tampered file are
indistinguishable by design; both raise :class:`UnsealError`.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from ibe_pubsub.keyserver.exceptions import KeyServerError, ServerSettingsError

FORMAT = "ibe-pubsub-sealed-v1"
ASSOCIATED_DATA = b"ibe-pubsub/v1/master-secret"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
# scrypt needs 128 * n * r bytes; the defaults take 32 MiB, the bounds allow 8 times more.
MAX_SCRYPT_MEMORY = 256 * 1024 * 1024
MAX_SCRYPT_P = 16


class UnsealError(KeyServerError, ValueError):
    """The sealed secret does not open: wrong passphrase or damaged file."""


class WrongPassphraseError(UnsealError):
    """Authentication failed: the passphrase is wrong (or the ciphertext was modified)."""


def _derive(passphrase: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(passphrase.encode("utf-8"))


def scrypt_parameters(doc: dict[str, Any]) -> tuple[int, int, int]:
    """``(n, r, p)`` of a sealed document, refused unless integers within the bounds."""
    n, r, p = doc["n"], doc["r"], doc["p"]
    if not all(type(v) is int for v in (n, r, p)):
        raise UnsealError(f"scrypt parameters n, r, p must be integers, got {n!r}, {r!r}, {p!r}")
    if n < 2 or n & (n - 1):
        raise UnsealError(f"scrypt parameter n must be a power of two of at least 2, got {n}")
    if r < 1 or not 1 <= p <= MAX_SCRYPT_P or 128 * n * r > MAX_SCRYPT_MEMORY:
        raise UnsealError(f"scrypt parameters n={n}, r={r}, p={p} are out of bounds (r >= 1, "
                          f"1 <= p <= {MAX_SCRYPT_P}, 128*n*r <= {MAX_SCRYPT_MEMORY} bytes)")
    return n, r, p


def seal_secret(secret: bytes, passphrase: str) -> bytes:
    """The JSON document that keeps ``secret`` confidential and authentic under ``passphrase``."""
    if not passphrase:
        raise ServerSettingsError("the passphrase must not be empty")
    salt, nonce = os.urandom(16), os.urandom(12)
    key = _derive(passphrase, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    sealed = ChaCha20Poly1305(key).encrypt(nonce, secret, ASSOCIATED_DATA)
    doc = {"format": FORMAT, "kdf": "scrypt", "n": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P,
           "salt": base64.b64encode(salt).decode(), "nonce": base64.b64encode(nonce).decode(),
           "aead": "chacha20-poly1305", "ciphertext": base64.b64encode(sealed).decode()}
    return json.dumps(doc, indent=1).encode()


def unseal_secret(document: bytes, passphrase: str) -> bytes:
    """Open what :func:`seal_secret` wrote; :class:`UnsealError` if it does not open."""
    try:
        doc = json.loads(document)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("kdf") != "scrypt":
            raise UnsealError("not a sealed ibe-pubsub secret")
        key = _derive(passphrase, base64.b64decode(doc["salt"]), *scrypt_parameters(doc))
        return ChaCha20Poly1305(key).decrypt(base64.b64decode(doc["nonce"]),
                                             base64.b64decode(doc["ciphertext"]), ASSOCIATED_DATA)
    except InvalidTag as exc:
        raise WrongPassphraseError("wrong passphrase, or the sealed master secret was modified"
                                   ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise UnsealError(f"the sealed master secret is damaged: {exc}") from exc
