"""Merging the members' directory listings (keyserver.threshold_directory): what one
member's answer must be, and how answers combine. With real members:
test_threshold_issuance.py::test_the_directory_is_kept_at_every_member_and_merged_most_listed_first."""

from __future__ import annotations

import pytest

from ibe_pubsub.keyserver.threshold_directory import (
    MAX_LISTED,
    DirectoryAnswerError,
    merge_listings,
    read_listing,
)


def entry(address, role="root", expires_at=100.0, vouched=True):
    return {"address": address, "role": role, "expires_at": expires_at, "vouched": vouched}


def listing(roots=(), members=()):
    return read_listing("symbol", {"attribute": "symbol", "roots": list(roots),
                                   "members": list(members)})


def test_a_listing_must_be_of_the_tree_asked_with_well_formed_entries():
    assert listing([entry("a:1")]).roots == {"a:1": entry("a:1")}
    bad = [{"attribute": "price", "roots": [], "members": []}, [], {"attribute": "symbol"},
           {"attribute": "symbol", "roots": {}, "members": []}]
    for field, value in (("address", 1), ("role", "admin"), ("expires_at", True),
                         ("expires_at", "soon"), ("vouched", 1)):
        bad.append({"attribute": "symbol", "roots": [entry("a:1") | {field: value}],
                    "members": []})
    bad.append({"attribute": "symbol", "roots": [entry(f"a:{k}") for k in
                                                 range(MAX_LISTED + 1)], "members": []})
    for answer in bad:
        with pytest.raises(DirectoryAnswerError):
            read_listing("symbol", answer)
    # Extra fields are dropped, not passed on.
    assert listing([entry("a:1") | {"note": "x"}]).roots["a:1"] == entry("a:1")


def test_merged_most_listed_first_then_vouched_and_a_role_by_majority():
    honest = listing([entry("r:1")], [entry("m:1", "subscriber", vouched=False),
                                      entry("m:2", "subscriber")])
    liar = listing([entry("a:0", expires_at=1e12), entry("r:1", expires_at=50.0),
                    entry("m:1", "subscriber")], [])
    merged = merge_listings("symbol", [honest, honest, liar])
    assert [(e["address"], e["listed_by"]) for e in merged["roots"]] == [("r:1", 3), ("a:0", 1)]
    # m:1 is a member for two members and a root for one: a member; as often listed as
    # m:2 but vouched for by nobody, it comes after it.
    assert [(e["address"], e["listed_by"], e["vouched"]) for e in merged["members"]] == [
        ("m:2", 2, True), ("m:1", 2, False)]
    assert merged["roots"][0]["expires_at"] == 100.0
    # Vouched by one member is vouched: the liar's vouch counts for m:1 against the others'.
    assert merge_listings("symbol", [honest, listing([], [entry("m:1", "subscriber")])])[
        "members"][0] == {"address": "m:1", "role": "subscriber", "expires_at": 100.0,
                          "vouched": True, "listed_by": 2}
    assert merge_listings("symbol", []) == {"attribute": "symbol", "roots": [], "members": []}
