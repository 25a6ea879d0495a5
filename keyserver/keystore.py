"""The key store in the data directory: sealed master secret, public parameters, admin token.

Layout of ``DIR``:

* ``master.sealed`` (0600): MSK and the server's Ed25519 signing key, sealed
  (:mod:`keyserver.sealing`) under ``$IBE_PUBSUB_PASSPHRASE``.
* ``public.json`` (0600): curve, MPK, schema, its signature, the server's verification key.
* ``admin.token`` (0600): the admin bearer token (``keyserver rotate-admin-token`` replaces it).
* ``keyserver.db`` (0600): the SQLite database, unless a database URL says otherwise.
* ``database.json`` (0600): the database ``init`` was given (:mod:`keyserver.binding`).

The directory itself is 0700 (:mod:`keyserver.permissions`). The peer-link CA
(:class:`PeerLinkCA`) has no file: its key is derived from the master secret and its
certificate is deterministic, so key stores made before it existed serve it too, and
replicas sharing a key store serve the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import msgpack
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ibe_pubsub.credentials import (
    SCHEME_VERSION,
    CodecError,
    MasterPublicKey,
    MasterSecretKey,
    PairingGroup,
    Schema,
    ca_certificate,
    ca_key_from_seed,
    decode_mpk,
    decode_msk,
    encode_mpk,
    encode_msk,
    fingerprint,
    load_group,
    peer_ca_message,
    schema_message,
    setup,
    to_pem,
)
from ibe_pubsub.keyserver.exceptions import KeyServerError
from ibe_pubsub.keyserver.sealing import (
    UnsealError,
    WrongPassphraseError,
    seal_secret,
    unseal_secret,
)

PASSPHRASE_ENV = "IBE_PUBSUB_PASSPHRASE"
SEALED_FILE = "master.sealed"
PUBLIC_FILE = "public.json"
ADMIN_TOKEN_FILE = "admin.token"
DATABASE_FILE = "keyserver.db"
MIN_ADMIN_TOKEN_LENGTH = 16
PEER_CA_PURPOSE = b"peer-link-ca"


class KeyStoreError(KeyServerError):
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
class PeerLinkCA:
    """The private CA of peer-link certificates (:mod:`credentials.peer_certificates`)."""

    key: Ed25519PrivateKey
    certificate: x509.Certificate
    signature: bytes
    """The key server's Ed25519 signature over ``peer_ca_message(DER)``: peers take the CA
    from the public parameters under the server key they already trust."""

    @property
    def pem(self) -> str:
        return to_pem(self.certificate)


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

    @property
    def fingerprint(self) -> str:
        """The signing key's fingerprint, as peers show it and the database records it."""
        return fingerprint(self.server_key)

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

    @cached_property
    def peer_ca(self) -> PeerLinkCA:
        """The peer-link CA, the same for the same master secret (Ed25519 signatures are
        deterministic)."""
        key = ca_key_from_seed(self.derived_key(PEER_CA_PURPOSE))
        certificate = ca_certificate(key)
        der = certificate.public_bytes(serialization.Encoding.DER)
        return PeerLinkCA(key, certificate, self.signing_key.sign(peer_ca_message(der)))

    def peer_ca_document(self) -> dict[str, str]:
        """The CA's fields of ``GET /v1/params``."""
        return {"peer_ca": self.peer_ca.pem, "peer_ca_signature": b64(self.peer_ca.signature)}

    def public_document(self) -> dict[str, Any]:
        """What ``public.json`` holds (and ``GET /v1/params`` starts from)."""
        return {"curve": self.mpk.curve, "mpk": b64(encode_mpk(self.mpk)),
                "schema": self.schema.to_dict(), "schema_id": self.schema.id,
                "schema_signature": b64(self.schema_signature), "server_key": b64(self.server_key)}


def write_private(path: Path, data: bytes) -> None:
    """A new file of mode 0600 (FileExistsError if ``path`` exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def create_keystore(data_dir: Path, schema: Schema, passphrase: str) -> tuple[KeyStore, str]:
    """Run setup, seal the secret, sign the schema, write the admin token; returns the
    key store and the admin token. Refuses to touch an existing key store."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
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
    write_private(data_dir / SEALED_FILE, seal_secret(secret, passphrase))
    write_private(data_dir / PUBLIC_FILE, json.dumps(store.public_document(), indent=1).encode())
    write_private(data_dir / ADMIN_TOKEN_FILE, (admin_token + "\n").encode())
    return store, admin_token


def _unseal(sealed_path: Path, passphrase: str) -> tuple[bytes, bytes]:
    """The MSK and signing-key bytes; a sealed file that opens but does not hold a map of
    the two is as unusable as one that does not open."""
    try:
        secret = msgpack.unpackb(unseal_secret(sealed_path.read_bytes(), passphrase))
    except OSError as exc:
        raise KeyStoreError(f"cannot read the key store: {exc}") from exc
    except WrongPassphraseError as exc:
        raise KeyStoreError(f"cannot unseal the master secret in {sealed_path}: {exc} "
                            f"(check ${PASSPHRASE_ENV})") from exc
    except UnsealError as exc:
        raise KeyStoreError(f"cannot unseal the master secret in {sealed_path}: {exc} "
                            "(restore the file from a backup)") from exc
    except (ValueError, msgpack.UnpackException) as exc:
        raise KeyStoreError(f"the master secret in {sealed_path} is damaged: {exc}") from exc
    if not isinstance(secret, dict) or not all(
            isinstance(secret.get(name), bytes) for name in ("msk", "signing_key")):
        raise KeyStoreError(
            f"the master secret in {sealed_path} is damaged: expected a map of byte strings "
            f"'msk' and 'signing_key', found {type(secret).__name__}")
    return secret["msk"], secret["signing_key"]


def read_admin_token(path: Path) -> str:
    """The admin token, refused when missing, empty or too short to be a secret: an empty
    file would otherwise make the empty bearer token an admin token."""
    fix = f"write a new one with `ibe-pubsub keyserver rotate-admin-token --data {path.parent}`"
    try:
        token = path.read_text().strip()
    except (OSError, ValueError) as exc:
        raise KeyStoreError(f"cannot read the admin token {path} ({exc}): {fix}") from exc
    if len(token) < MIN_ADMIN_TOKEN_LENGTH:
        raise KeyStoreError(f"the admin token in {path} is {'empty' if not token else 'too short'} "
                            f"(at least {MIN_ADMIN_TOKEN_LENGTH} characters): {fix}")
    return token


def rotate_admin_token(data_dir: Path) -> Path:
    """Replace ``admin.token`` with a fresh token (0600, atomically: a crash leaves the old
    or the new one); returns its path. A running server keeps the hash it read at start,
    so the new token takes effect, and the old one stops working, when it restarts."""
    if not (data_dir / SEALED_FILE).is_file():
        raise KeyStoreError(f"no key store in {data_dir} (run `ibe-pubsub keyserver init`)")
    path = data_dir / ADMIN_TOKEN_FILE
    staging = data_dir / f".{ADMIN_TOKEN_FILE}.{secrets.token_hex(4)}"
    try:
        write_private(staging, (new_token("adm") + "\n").encode())
        os.replace(staging, path)
    except OSError as exc:
        staging.unlink(missing_ok=True)
        raise KeyStoreError(f"cannot write a new admin token to {path}: {exc}") from exc
    return path


def load_keystore(data_dir: Path, passphrase: str) -> KeyStore:
    """Unseal the key store of ``data_dir``; :class:`KeyStoreError` with a clear reason."""
    sealed_path, public_path = data_dir / SEALED_FILE, data_dir / PUBLIC_FILE
    if not sealed_path.is_file():
        raise KeyStoreError(f"no key store in {data_dir} (run `ibe-pubsub keyserver init`)")
    msk_bytes, signing_key = _unseal(sealed_path, passphrase)
    admin_token = read_admin_token(data_dir / ADMIN_TOKEN_FILE)
    group = load_group()
    try:
        public = json.loads(public_path.read_text())
        mpk_bytes = base64.b64decode(public["mpk"])
        schema = Schema.from_dict(public["schema"])
        schema_signature = base64.b64decode(public["schema_signature"])
    except OSError as exc:
        raise KeyStoreError(f"cannot read the key store: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise KeyStoreError(f"{public_path} is damaged: {exc!r}") from exc
    try:
        mpk = decode_mpk(group, mpk_bytes)
        msk = decode_msk(group, msk_bytes)
        signing = Ed25519PrivateKey.from_private_bytes(signing_key)
    except CodecError as exc:
        raise KeyStoreError(
            f"the key store in {data_dir} was written for another scheme or format version "
            f"({exc}); this build implements scheme version {SCHEME_VERSION}. Run "
            f"`ibe-pubsub keyserver init` again with a new data directory and re-enrol "
            f"every peer.") from exc
    except ValueError as exc:
        raise KeyStoreError(f"the master secret in {sealed_path} is damaged: {exc}") from exc
    return KeyStore(group=group, mpk=mpk, msk=msk, schema=schema, signing_key=signing,
                    schema_signature=schema_signature, admin_token_hash=token_hash(admin_token))


def passphrase_from_env() -> str:
    value = os.environ.get(PASSPHRASE_ENV, "")
    if not value:
        raise KeyStoreError(f"set the passphrase of the master secret in ${PASSPHRASE_ENV}")
    return value
