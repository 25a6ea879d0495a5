"""Bundles that ``bulk issue`` writes, on the peer's side: read the file, check it, and decide
what the peer delivers or publishes with it.

A bundle holds one identity's keys for one epoch, signed by the key server, and the
identity's token if bulk issuance created that identity. Its holder needs the key server
for the public parameters, a link certificate and the directory, never for keys: every
epoch needs the next bundle (``peer run`` re-reads the file before its keys expire).

A bundle holds the credentials its keys were issued for, not the predicate they came
from: a subscriber delivers, and a publisher may send, every event those credentials
enclose (:class:`CredentialRegion`), or exactly the events of a ``--subscribe`` or
``--advertise`` predicate that lies inside them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import (
    Credential,
    EventFilter,
    Schema,
    covering_credential,
    decompose,
    enclosing_path,
    fine_split,
    parse_predicate,
)
from ibe_pubsub.keyserver import (
    BulkBundle,
    BundleError,
    KeyServerClient,
    ServerParams,
    decode_bulk_bundle,
)

COMMANDS = {"subscriber": "peer run --bundle", "publisher": "publish --bundle"}
Stamp = tuple[int, int, int]
MISSING: Stamp = (0, 0, -1)


def stamp(path: str) -> Stamp:
    """What changes when the file is rewritten or replaced (``MISSING`` while it is not
    there)."""
    try:
        st = os.stat(path)
    except OSError:
        return MISSING
    return st.st_ino, st.st_mtime_ns, st.st_size


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _read(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BundleError(f"bundle {path}: cannot read it: {exc.strerror}") from None
    except ValueError:  # UnicodeDecodeError too
        raise BundleError(f"bundle {path}: it is not a bundle of `bulk issue` (not JSON)"
                          ) from None


def file_token(path: str) -> str | None:
    """The token in the file, if any, unchecked: the key server tells whose it is
    (:func:`open_bundle`)."""
    doc = _read(path)
    token = doc.get("token") if isinstance(doc, dict) else None
    return token if isinstance(token, str) else None


def _load(path: str, params: ServerParams, role: str) -> BulkBundle:
    doc = _read(path)
    try:
        bundle = decode_bulk_bundle(params, doc)
    except BundleError as exc:
        raise BundleError(f"bundle {path}: {exc}") from exc
    if bundle.role != role:
        raise BundleError(f"bundle {path} holds {bundle.role} keys: use it with "
                          f"`ibe-pubsub {COMMANDS[bundle.role]}`")
    return bundle


def open_bundle(path: str, params: ServerParams, role: str,
                client: KeyServerClient) -> BulkBundle:
    """The bundle in ``path``, checked: the key server's and unaltered, for ``role``, of the
    key server's current epoch, and of the identity whose token ``client`` carries (asked
    before anything is certified for that identity)."""
    bundle = _load(path, params, role)
    if bundle.keys.epoch != params.epoch:
        raise BundleError(f"bundle {path} holds the keys of epoch {bundle.keys.epoch}, the "
                          f"key server is in epoch {params.epoch} (until "
                          f"{when(params.epoch_end)}): use a bundle of epoch {params.epoch}")
    holder = client.whoami()["name"]
    if holder != bundle.identity:
        raise BundleError(f"bundle {path} is for identity {bundle.identity!r}, but the token "
                          f"belongs to {holder!r}: give the token of {bundle.identity!r}")
    return bundle


def next_bundle(path: str, params: ServerParams, held: BulkBundle) -> BulkBundle:
    """The next epoch's bundle of the same identity, once it has replaced ``held`` in
    ``path`` (BundleError until then)."""
    bundle = _load(path, params, held.role)
    if bundle.identity != held.identity:
        raise BundleError(f"bundle {path} is now identity {bundle.identity!r}'s, not "
                          f"{held.identity!r}'s")
    if bundle.keys.epoch != held.keys.epoch + 1:
        raise BundleError(f"bundle {path} holds the keys of epoch {bundle.keys.epoch}, not "
                          f"yet those of epoch {held.keys.epoch + 1}")
    return bundle


@dataclass(frozen=True)
class CredentialRegion:
    """The events a set of credentials encloses: on every attribute, a value that one of
    them encloses. What a bundle's keys open, and nothing else."""

    schema: Schema
    credentials: Mapping[str, tuple[Credential, ...]]

    def matches(self, values: Mapping[str, Any]) -> bool:
        try:
            return all(covering_credential(self.credentials.get(a.name, ()),
                                           enclosing_path(self.schema, a.name, values[a.name]))
                       is not None for a in self.schema.attributes)
        except (KeyError, TypeError, ValueError):
            return False

    def encloses(self, credential: Credential) -> bool:
        """Whether every value of ``credential`` lies in the region (a numeric one may span
        several of the region's credentials)."""
        held = self.credentials.get(credential.attribute, ())
        if any(h.covers(credential) for h in held):
            return True
        if credential.kind != "num" or not any(credential.covers(h) for h in held):
            return False
        return all(self.encloses(c) for c in fine_split(self.schema, credential))

    def __str__(self) -> str:
        parts = [" or ".join(c.label() for c in creds)
                 for creds in self.credentials.values() if not any(c.is_root for c in creds)]
        return " and ".join(f"({p})" if " or " in p else p for p in parts)


def event_filter(schema: Schema, bundle: BulkBundle, text: str | None,
                 option: str) -> EventFilter:
    """The bundle's region, or the predicate ``text`` (of ``option``) if it lies inside it."""
    region = CredentialRegion(schema, bundle.keys.credentials)
    if text is None:
        return region
    predicate = parse_predicate(schema, text)
    outside = next((c for cs in decompose(schema, predicate).values() for c in cs
                    if not region.encloses(c)), None)
    if outside is not None:
        raise BundleError(f"{option} {text!r} selects events outside the bundle's credentials "
                          f"{region} (e.g. those of {outside}); leave {option} out to take "
                          "the bundle's")
    return predicate
