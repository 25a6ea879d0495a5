"""The bootstrap directory of a threshold deployment: every member keeps its own (the
version-2 ``/v1/directory`` routes, each under its own claims of certified addresses and
trees joined), a peer leases its address at every member, and a joiner merges the
members' lookups.

No member is trusted with the list, and what a hostile one can do is bounded. It can leave
entries out: the others list them. It can add addresses, but no more than an honest member
lists (every live root, at most :data:`MAX_ROOTS`, and a sample of the other members as
large as the one asked for), and an address listed by more members comes first, ties in
an order of the client's own drawing, so invented addresses come after every address
listed by more members than the hostile ones: when the honest members that answer
outnumber the hostile ones, after every root they list (members are samples, which
differ between members: there invented addresses compete only with those sampled as
rarely). A peer met at an invented address must still show a link certificate that a
quorum of members signed for it (the TLS check after the handshake), so an invented entry
costs a joiner a failed dial, not a link. ``lookup`` answers in the shape of
``/v1/directory/{attribute}``, each entry with ``listed_by`` and ``vouched_by``, the
numbers of members that listed it and vouched for it."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ibe_pubsub.credentials import ROLES, PeerCertificateError, canonical_address
from ibe_pubsub.keyserver.exceptions import KeyServerError

#: The most roots one tree's listing may hold (an honest member lists every live root).
MAX_ROOTS = 256
#: The longest address a listing may hold (a DNS name is at most 253 characters).
MAX_ADDRESS = 261
MEMBER_ROLES = frozenset(ROLES) - {"root"}


class DirectoryAnswerError(KeyServerError):
    """A member's lookup answer is not a directory listing."""


@dataclass(frozen=True)
class Listing:
    """One member's lookup: its roots and members, by address."""

    roots: dict[str, dict[str, Any]]
    members: dict[str, dict[str, Any]]


def read_listing(attribute: str, answer: Any, sample: int) -> Listing:
    """A member's answer to ``GET /v1/directory/{attribute}?sample=sample``, checked: for
    that tree, at most :data:`MAX_ROOTS` roots and ``sample`` members, each address once,
    in canonical ``host:port`` spelling, roots as roots and members as subscribers or
    publishers, with a finite expiry and a vouch; DirectoryAnswerError otherwise."""
    if not isinstance(answer, dict) or answer.get("attribute") != attribute:
        raise DirectoryAnswerError(f"its answer is not a listing of the tree {attribute!r}")
    listing = Listing(_entries(answer.get("roots"), MAX_ROOTS, frozenset({"root"})),
                      _entries(answer.get("members"), sample, MEMBER_ROLES))
    if set(listing.roots) & set(listing.members):
        raise DirectoryAnswerError("its listing names an address both as a root and as a "
                                   "member")
    return listing


def _entries(entries: Any, most: int, roles: frozenset[str]) -> dict[str, dict[str, Any]]:
    if not isinstance(entries, list) or len(entries) > most:
        raise DirectoryAnswerError(f"its listing holds no list of at most {most} entries")
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise DirectoryAnswerError("an entry of its listing is not an object")
        address, role = entry.get("address"), entry.get("role")
        expires_at, vouched = entry.get("expires_at"), entry.get("vouched")
        if not (isinstance(address, str) and len(address) <= MAX_ADDRESS
                and _canonical(address) and address not in out):
            raise DirectoryAnswerError("an entry of its listing has no address in canonical "
                                       "host:port spelling, or one listed twice")
        if not (isinstance(role, str) and role in roles):
            raise DirectoryAnswerError(f"its entry for {address} has the role {role!r} in a "
                                       f"list of {sorted(roles)}")
        if not (isinstance(expires_at, int | float) and not isinstance(expires_at, bool)
                and math.isfinite(expires_at) and isinstance(vouched, bool)):
            raise DirectoryAnswerError(f"its entry for {address} has no finite expiry and "
                                       "vouch")
        out[address] = {"address": address, "role": role, "expires_at": float(expires_at),
                        "vouched": vouched}
    return out


def _canonical(address: str) -> bool:
    try:
        return canonical_address(address) == address
    except PeerCertificateError:
        return False


def merge_listings(attribute: str, listings: Sequence[Listing],
                   rng: random.Random | None = None) -> dict[str, Any]:
    """The members' listings as one: each address once per list, with ``listed_by`` (how
    many members listed it there) and ``vouched_by`` (how many of those vouched for it),
    ``vouched`` if most of them did, the median expiry they gave, and the role most gave;
    most listed first, then most vouched for, ties in an order drawn from ``rng``, so that
    no member chooses one by the addresses it invents. An address some list as a root and
    others as a member is in both lists, each with its own counts: the link certificate
    met there says which it is."""
    rng = rng or random.SystemRandom()
    return {"attribute": attribute,
            "roots": _ranked([listing.roots for listing in listings], rng),
            "members": _ranked([listing.members for listing in listings], rng)}


def _ranked(lists: Sequence[dict[str, dict[str, Any]]], rng: random.Random
            ) -> list[dict[str, Any]]:
    listed: dict[str, list[dict[str, Any]]] = {}
    for entries in lists:
        for address, entry in entries.items():
            listed.setdefault(address, []).append(entry)
    merged = []
    for address, entries in listed.items():
        vouched_by = sum(e["vouched"] for e in entries)
        roles = [e["role"] for e in entries]
        merged.append({"address": address, "role": max(sorted(set(roles)), key=roles.count),
                       "expires_at": statistics.median_low(e["expires_at"] for e in entries),
                       "vouched": 2 * vouched_by > len(entries), "listed_by": len(entries),
                       "vouched_by": vouched_by})
    rng.shuffle(merged)
    return sorted(merged, key=lambda e: (-e["listed_by"], -e["vouched_by"]))
