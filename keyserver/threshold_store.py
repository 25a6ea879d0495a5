"""A threshold key server's files (docs/operations.md, "A threshold deployment").

* ``member.sealed`` (0600): the server's Ed25519 member key, which signs its set-up
  messages; its public half is what the other operators pin.
* ``threshold.sealed`` (0600): this server's shares ``delta_i``, ``phi_i``, ``x_i``,
  ``rho_i`` and its PRF key, written once the set-up finished.
* ``threshold.json`` (0600 like the rest, though nothing in it is secret): the public
  outcome, the same at every member: the plan (deployment, threshold, members) and the
  threshold public key. Clients need this file and nothing else from the set-up.

Both sealed files use the passphrase of ``$IBE_PUBSUB_PASSPHRASE`` (keyserver.sealing).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from ibe_pubsub.credentials import CodecError, PairingGroup
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver.exceptions import KeyServerError
from ibe_pubsub.keyserver.keystore import write_private
from ibe_pubsub.keyserver.sealing import seal_secret, unseal_secret
from ibe_pubsub.keyserver.setup_protocol import (
    Member,
    SetupError,
    SetupPlan,
    SetupResult,
    public_key_fingerprint,
    raw_public_key,
)

MEMBER_KEY_FILE, SHARES_FILE = "member.sealed", "threshold.sealed"
THRESHOLD_PUBLIC_FILE = "threshold.json"
#: Version 2 added the sharing of zero ``rho`` (tag 18 and the sealed shares changed): files
#: of an earlier set-up are refused with a message saying so, never half read.
PUBLIC_FORMAT = "ibe-pubsub-threshold-v2"
SHARES_KIND = "threshold shares v2"
EARLIER = "(an earlier version's set-up, without rho: run the set-up again)"


class ThresholdStoreError(KeyServerError, ValueError):
    """A threshold server's file is missing, exists already, or does not hold what it
    should."""


def _write_once(path: Path, data: bytes) -> None:
    try:
        write_private(path, data)
    except FileExistsError as exc:
        raise ThresholdStoreError(f"{path} exists already: a data directory holds one "
                                  "member key and one set-up") from exc


def _unsealed_map(path: Path, passphrase: str, kind: str) -> dict[str, Any]:
    try:
        document = path.read_bytes()
    except FileNotFoundError as exc:
        raise ThresholdStoreError(f"{path} does not exist") from exc
    content = msgpack.unpackb(unseal_secret(document, passphrase), raw=False)
    if not isinstance(content, dict) or content.get("kind") != kind:
        raise ThresholdStoreError(f"{path} does not hold a {kind}")
    return content


def member_key_text(key: bytes) -> str:
    """How operators exchange a member key: base64 of the raw 32 bytes."""
    return base64.b64encode(key).decode()


def create_member_key(data_dir: Path, passphrase: str) -> bytes:
    """Make ``data_dir`` (0700) and a new member key sealed in it; its public half."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    _write_once(data_dir / MEMBER_KEY_FILE, seal_secret(
        msgpack.packb({"kind": "member key", "ed25519": raw}), passphrase))
    return raw_public_key(key)


def load_member_key(data_dir: Path, passphrase: str) -> Ed25519PrivateKey:
    content = _unsealed_map(data_dir / MEMBER_KEY_FILE, passphrase, "member key")
    return Ed25519PrivateKey.from_private_bytes(content["ed25519"])


def parse_members(text: str) -> tuple[Member, ...]:
    """``KEY@URL,KEY@URL,...`` (member 1 first), each KEY the base64 member key its
    operator printed."""
    members = []
    for number, item in enumerate((p.strip() for p in text.split(",") if p.strip()), start=1):
        key_text, at, url = item.partition("@")
        if not at or not url.startswith(("http://", "https://")):
            raise SetupError(f"member {number}: expected KEY@http(s)://HOST:PORT, got {item!r}")
        try:
            key = base64.b64decode(key_text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SetupError(f"member {number}: the key is not base64") from exc
        members.append(Member(url.rstrip("/"), key))
    return tuple(members)


def public_document(plan: SetupPlan, public_key: T.ThresholdPublicKey) -> dict[str, Any]:
    return {"format": PUBLIC_FORMAT, "deployment": plan.deployment, "t": plan.t,
            "members": [{"url": m.url, "key": member_key_text(m.key)} for m in plan.members],
            "epoch_seconds": plan.epoch_seconds, "grace_seconds": plan.grace,
            "public_key": base64.b64encode(T.encode_public_key(public_key)).decode(),
            "fingerprint": public_key_fingerprint(public_key)}


def save_setup(data_dir: Path, passphrase: str, plan: SetupPlan, result: SetupResult) -> None:
    """Write this member's shares (sealed) and the public outcome."""
    secrets, size = result.secrets, 32
    _write_once(data_dir / SHARES_FILE, seal_secret(msgpack.packb({
        "kind": SHARES_KIND, "index": secrets.index,
        "delta": secrets.delta.to_bytes(size, "big"), "phi": secrets.phi.to_bytes(size, "big"),
        "x": secrets.x.to_bytes(size, "big"), "rho": secrets.rho.to_bytes(size, "big"),
        "prf_key": secrets.prf_key}), passphrase))
    # 0600 like every file of the data directory (the server refuses others); it holds
    # nothing secret, and operators copy it to their clients.
    _write_once(data_dir / THRESHOLD_PUBLIC_FILE, (json.dumps(
        public_document(plan, result.public_key), indent=1) + "\n").encode())


def read_public_document(path: Path, group: PairingGroup
                         ) -> tuple[SetupPlan, T.ThresholdPublicKey]:
    """The plan and the checked public key of a ``threshold.json``."""
    try:
        doc = json.loads(path.read_text())
        found = doc.get("format") if isinstance(doc, dict) else None
        if found != PUBLIC_FORMAT:
            raise ThresholdStoreError(f"{path} is not a {PUBLIC_FORMAT} document"
                                      + (f" {EARLIER}" if found == "ibe-pubsub-threshold-v1"
                                         else ""))
        plan = SetupPlan(doc["deployment"], doc["t"], tuple(
            Member(m["url"], base64.b64decode(m["key"], validate=True))
            for m in doc["members"]), doc["epoch_seconds"], doc["grace_seconds"])
        public_key = T.decode_public_key(group, base64.b64decode(doc["public_key"],
                                                                 validate=True))
    except (OSError, ValueError, KeyError, TypeError, binascii.Error, CodecError,
            SetupError) as exc:
        raise ThresholdStoreError(f"{path}: {exc}") from exc
    if (public_key.deployment, public_key.t, public_key.n) != (
            plan.deployment.encode(), plan.t, plan.n):
        raise ThresholdStoreError(f"{path}: the public key is not the plan's deployment")
    return plan, public_key


@dataclass(frozen=True)
class ThresholdMember:
    """What a key server that took part in a set-up serves with: the plan, the threshold
    public key and its own shares (its issuer workers issue key shares with them; the web
    process signs its schema with ``x_i``, once)."""

    plan: SetupPlan
    public_key: T.ThresholdPublicKey
    secrets: T.ServerSecrets
    signing_key: Ed25519PrivateKey
    """Its own member key (``threshold.json`` lists the public half): what it signs peer-link
    certificates with, where its consent, not its share, is what counts."""

    @property
    def index(self) -> int:
        return self.secrets.index

    @functools.cached_property
    def scope(self) -> bytes:
        """What each of its link signatures starts with (``T.deployment_scope``)."""
        return T.deployment_scope(self.public_key)

    @property
    def member_keys(self) -> dict[int, bytes]:
        """Every member's public key, by index."""
        return {i: m.key for i, m in enumerate(self.plan.members, start=1)}


def load_member(data_dir: Path, passphrase: str, group: PairingGroup) -> ThresholdMember | None:
    """This data directory's set-up outcome, or None for a single (version-2) key server."""
    if not (data_dir / SHARES_FILE).exists():
        return None
    plan, public_key = read_public_document(data_dir / THRESHOLD_PUBLIC_FILE, group)
    secrets = load_shares(data_dir, passphrase)
    if not 0 < secrets.index <= plan.n:
        raise ThresholdStoreError(f"{data_dir / SHARES_FILE} holds the shares of server "
                                  f"{secrets.index}, not a member of the plan")
    g_hat, i = public_key.mpk.g_hat, secrets.index
    if tuple(group.exp_secret(g_hat, s) for s in (
            secrets.delta, secrets.phi, secrets.x, secrets.rho)) != (
            public_key.delta_shares[i], public_key.phi_shares[i], public_key.x_shares[i],
            public_key.rho_shares[i]):
        raise ThresholdStoreError(f"the shares in {data_dir / SHARES_FILE} are not server "
                                  f"{i}'s in {data_dir / THRESHOLD_PUBLIC_FILE}: this server "
                                  "would answer bad shares")
    signing_key = load_member_key(data_dir, passphrase)
    if raw_public_key(signing_key) != plan.members[i - 1].key:
        raise ThresholdStoreError(f"the member key in {data_dir / MEMBER_KEY_FILE} is not "
                                  f"member {i}'s in {data_dir / THRESHOLD_PUBLIC_FILE}")
    return ThresholdMember(plan, public_key, secrets, signing_key)


def load_shares(data_dir: Path, passphrase: str) -> T.ServerSecrets:
    """This member's sealed shares."""
    content = _unsealed_map(data_dir / SHARES_FILE, passphrase, SHARES_KIND)
    return T.ServerSecrets(content["index"], *(int.from_bytes(content[name], "big")
                                               for name in ("delta", "phi", "x", "rho")),
                           content["prf_key"])
