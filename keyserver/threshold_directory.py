"""The bootstrap directory of a threshold deployment: every member keeps its own (the
version-2 ``/v1/directory`` routes, each under its own claims of certified addresses and
trees joined), a peer leases its address at every member, and a joiner merges the
members' lookups.

No member is trusted with the list. A member can leave entries out (the others list them)
or add addresses: an address listed by more members comes first, so one hostile member's
additions come after every entry the honest members agree on, and a peer met at such an
address must still show a link certificate that a quorum of members signed for it (the
TLS check after the handshake), so an invented entry costs a joiner a failed dial, not a
link. ``lookup`` answers in the shape of ``/v1/directory/{attribute}``, each entry with
``listed_by``, the number of members that listed it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ibe_pubsub.keyserver.exceptions import KeyServerError

#: The most entries of one kind a member's lookup may list; more is no honest answer (a
#: member lists every live root of a tree and a sample of at most 100 other members).
MAX_LISTED = 1000
ROLES = frozenset({"root", "subscriber", "publisher"})


class DirectoryAnswerError(KeyServerError):
    """A member's lookup answer is not a directory listing."""


@dataclass(frozen=True)
class Listing:
    """One member's lookup: its roots and members, by address."""

    roots: dict[str, dict[str, Any]]
    members: dict[str, dict[str, Any]]


def read_listing(attribute: str, answer: Any) -> Listing:
    """A member's answer to ``GET /v1/directory/{attribute}``, checked: for that tree,
    entries of known roles with an address, an expiry and a vouch; DirectoryAnswerError
    otherwise."""
    if not isinstance(answer, dict) or answer.get("attribute") != attribute:
        raise DirectoryAnswerError(f"its answer is not a listing of the tree {attribute!r}")
    return Listing(_entries(answer.get("roots")), _entries(answer.get("members")))


def _entries(entries: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(entries, list) or len(entries) > MAX_LISTED:
        raise DirectoryAnswerError(f"its listing holds no list of at most {MAX_LISTED} entries")
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("address"), str)
                and entry.get("role") in ROLES
                and isinstance(entry.get("expires_at"), int | float)
                and not isinstance(entry.get("expires_at"), bool)
                and isinstance(entry.get("vouched"), bool)):
            raise DirectoryAnswerError("an entry of its listing is not an address with a "
                                       "role, an expiry and a vouch")
        out[entry["address"]] = {k: entry[k] for k in ("address", "role", "expires_at",
                                                       "vouched")}
    return out


def merge_listings(attribute: str, listings: Sequence[Listing]) -> dict[str, Any]:
    """The members' listings as one: each address once, with the number of members that
    listed it (``listed_by``), vouched if one of them vouched for it, until the latest
    expiry one of them gave; most listed first, then vouched, then by address. An address
    one member lists as a root and another as a member is a root if most list it so."""
    roots: dict[str, list[dict[str, Any]]] = {}
    members: dict[str, list[dict[str, Any]]] = {}
    for listing in listings:
        for address, entry in listing.roots.items():
            roots.setdefault(address, []).append(entry)
        for address, entry in listing.members.items():
            members.setdefault(address, []).append(entry)
    for address in set(roots) & set(members):
        fewer = roots if len(roots[address]) < len(members[address]) else members
        del fewer[address]
    return {"attribute": attribute, "roots": _ranked(roots), "members": _ranked(members)}


def _ranked(listed: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    merged = [{"address": address, "role": entries[0]["role"],
               "expires_at": max(e["expires_at"] for e in entries),
               "vouched": any(e["vouched"] for e in entries), "listed_by": len(entries)}
              for address, entries in listed.items()]
    return sorted(merged, key=lambda e: (-e["listed_by"], not e["vouched"], e["address"]))
