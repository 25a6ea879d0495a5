"""The key store in the data directory: sealed master secret, public parameters, admin token.

Layout of ``DIR``:

* ``master.sealed`` (0600): MSK and the server's Ed25519 signing key, sealed
  (:mod:`keyserver.sealing`) under ``$IBE_PUBSUB_PASSPHRASE``.
* ``public.json``: curve, MPK, schema, its signature, the server's verification key.
* ``admin.token`` (0600): the admin bearer token.
* ``keyserver.db``: the SQLite database, unless a database URL says otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from credentials.backends import load_group
from credentials.certificates import schema_message
from credentials.codec import CodecError, decode_mpk, decode_msk, encode_mpk, encode_msk
from credentials.groups import PairingGroup
from credentials.keys import SCHEME_VERSION, MasterPublicKey, MasterSecretKey
from credentials.schema import Schema
from credentials.scheme import setup
from keyserver.sealing import seal_secret, unseal_secret

PASSPHRASE_ENV = "IBE_PUBSUB_PASSPHRASE"
SEALED_FILE = "master.sealed"
PUBLIC_FILE = "public.json"
ADMIN_TOKEN_FILE = "admin.token"
DATABASE_FILE = "keyserver.db"


class KeyStoreError(Exception):
    """The key store cannot be created or opened; the message says why and what to do."""


def new_token(prefix: str) -> str:
    """A fresh 256-bit bearer token."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def token_hash(token: str) -> str:
    """Tokens are high-entropy, so a plain SHA-256 is a safe at-rest form."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class KeyStore:
    """Everything the key server needs in memory to issue keys."""

    group: PairingGroup
    mpk: MasterPublicKey
    msk: MasterSecretKey
    schema: Schema
    signing_key: Ed25519PrivateKey
    schema_signature: bytes
    admin_token_hash: str

    @property
    def server_key(self) -> bytes:
        """The raw 32-byte Ed25519 verification key."""
        return self.signing_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def signing_key_bytes(self) -> bytes:
        return self.signing_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
            serialization.NoEncryption())

    def msk_bytes(self) -> bytes:
        return encode_msk(self.group, self.msk)

    def derived_key(self, purpose: bytes) -> bytes:
        """A 32-byte key for ``purpose`` derived from the master secret (e.g. bulk results)."""
        return HKDF(SHA256(), 32, salt=None, info=b"ibe-pubsub/v1/" + purpose).derive(
            self.msk_bytes() + self.signing_key_bytes())

    def public_document(self) -> dict[str, Any]:
        return {"curve": self.mpk.curve, "mpk": b64(encode_mpk(self.mpk)),
                "schema": self.schema.to_dict(), "schema_id": self.schema.id,
                "schema_signature": b64(self.schema_signature), "server_key": b64(self.server_key)}


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def create_keystore(data_dir: Path, schema: Schema, passphrase: str) -> tuple[KeyStore, str]:
    """Run setup, seal the secret, sign the schema, write the admin token; returns the
    key store and the admin token. Refuses to touch an existing key store."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if (data_dir / SEALED_FILE).exists():
        raise KeyStoreError(f"{data_dir / SEALED_FILE} exists: refusing to overwrite a key store")
    group = load_group()
    mpk, msk = setup(group)
    signing_key = Ed25519PrivateKey.generate()
    admin_token = new_token("adm")
    store = KeyStore(group=group, mpk=mpk, msk=msk, schema=schema, signing_key=signing_key,
                     schema_signature=signing_key.sign(schema_message(schema)),
                     admin_token_hash=token_hash(admin_token))
    secret = msgpack.packb({"msk": store.msk_bytes(), "signing_key": store.signing_key_bytes()})
    _write_private(data_dir / SEALED_FILE, seal_secret(secret, passphrase))
    (data_dir / PUBLIC_FILE).write_text(json.dumps(store.public_document(), indent=1))
    _write_private(data_dir / ADMIN_TOKEN_FILE, (admin_token + "\n").encode())
    return store, admin_token


def load_keystore(data_dir: Path, passphrase: str) -> KeyStore:
    """Unseal the key store of ``data_dir``; :class:`KeyStoreError` with a clear reason."""
    sealed_path = data_dir / SEALED_FILE
    if not sealed_path.is_file():
        raise KeyStoreError(f"no key store in {data_dir} (run `ibe-pubsub keyserver init`)")
    try:
        secret = msgpack.unpackb(unseal_secret(sealed_path.read_bytes(), passphrase))
        public = json.loads((data_dir / PUBLIC_FILE).read_text())
        admin_token = (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
    except OSError as exc:
        raise KeyStoreError(f"cannot read the key store: {exc}") from exc
    except ValueError as exc:
        raise KeyStoreError(f"cannot unseal the master secret in {sealed_path}: {exc} "
                            f"(check ${PASSPHRASE_ENV})") from exc
    group = load_group()
    try:
        mpk = decode_mpk(group, base64.b64decode(public["mpk"]))
        msk = decode_msk(group, secret["msk"])
    except CodecError as exc:
        raise KeyStoreError(
            f"the key store in {data_dir} was written for another scheme or format version "
            f"({exc}); this build implements scheme version {SCHEME_VERSION}. Run "
            f"`ibe-pubsub keyserver init` again with a new data directory and re-enrol "
            f"every peer.") from exc
    return KeyStore(
        group=group,
        mpk=mpk,
        msk=msk,
        schema=Schema.from_dict(public["schema"]),
        signing_key=Ed25519PrivateKey.from_private_bytes(secret["signing_key"]),
        schema_signature=base64.b64decode(public["schema_signature"]),
        admin_token_hash=token_hash(admin_token))


def passphrase_from_env() -> str:
    value = os.environ.get(PASSPHRASE_ENV, "")
    if not value:
        raise KeyStoreError(f"set the passphrase of the master secret in ${PASSPHRASE_ENV}")
    return value
