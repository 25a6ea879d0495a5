"""Merging the members' directory listings (keyserver.threshold_directory): what one
member's answer must be, and how answers combine so that hostile members steer no joiner.
With real members: test_threshold_issuance.py::test_the_directory_is_kept_at_every_member_
and_merged_most_listed_first."""

from __future__ import annotations

import random

import pytest

from ibe_pubsub.keyserver.threshold_directory import (
    MAX_ROOTS,
    DirectoryAnswerError,
    merge_listings,
    read_listing,
)

SAMPLE = 8


def entry(address, role="root", expires_at=100.0, vouched=True):
    return {"address": address, "role": role, "expires_at": expires_at, "vouched": vouched}


def member(address, **fields):
    return entry(address, "subscriber", **fields)


def listing(roots=(), members=()):
    return read_listing("symbol", {"attribute": "symbol", "roots": list(roots),
                                   "members": list(members)}, SAMPLE)


def test_a_listing_must_be_of_the_tree_asked_and_no_larger_than_an_honest_one():
    assert listing([entry("10.0.0.1:1")]).roots == {"10.0.0.1:1": entry("10.0.0.1:1")}
    assert listing([entry("10.0.0.1:1") | {"note": "x"}]).roots["10.0.0.1:1"] == entry(
        "10.0.0.1:1")  # extra fields dropped, not passed on
    roots = [entry(f"10.0.{k // 250}.{k % 250 + 1}:1") for k in range(MAX_ROOTS + 1)]
    members = [member(f"10.1.0.{k + 1}:1") for k in range(SAMPLE + 1)]
    assert len(listing(roots[:-1], members[:-1]).roots) == MAX_ROOTS  # the largest honest one
    bad = [{"attribute": "price", "roots": [], "members": []}, [], {"attribute": "symbol"},
           {"attribute": "symbol", "roots": {}, "members": []},
           {"attribute": "symbol", "roots": roots, "members": []},  # more roots than any tree
           {"attribute": "symbol", "roots": [], "members": members}]  # more than the sample
    for answer in bad:
        with pytest.raises(DirectoryAnswerError):
            read_listing("symbol", answer, SAMPLE)


@pytest.mark.parametrize("roots, members", [
    ([entry("10.0.0.1:1"), entry("10.0.0.1:1")], []),  # twice
    ([entry("10.0.0.1:1")], [member("10.0.0.1:1")]),  # a root and a member
    ([member("10.0.0.1:1")], []),  # a subscriber among the roots
    ([], [entry("10.0.0.1:1")]),  # a root among the members
    ([entry("10.0.0.1:1", role=[])], []),  # unhashable
    ([entry("10.0.0.1:1", expires_at=float("nan"))], []),
    ([entry("10.0.0.1:1", expires_at=float("inf"))], []),
    ([entry("10.0.0.1:1", expires_at=True)], []),
    ([entry("10.0.0.1:1", vouched=1)], []),
    ([entry("")], []), ([entry("10.0.0.1:1\r\nforged log line")], []),
    ([entry("https://evil/")], []), ([entry("010.0.0.1:1")], []),  # not canonical
    ([entry("a" * 300 + ".example:1")], []), ([entry(1)], []), (["10.0.0.1:1"], []),
])
def test_entries_that_no_honest_member_lists_are_refused(roots, members):
    with pytest.raises(DirectoryAnswerError):
        listing(roots, members)


def test_merged_by_count_then_vouches_ties_in_the_clients_order():
    real, invented = "10.0.0.1:1", "10.0.0.0:1"  # the invented one sorts first
    honest = listing([entry(real, vouched=False)])
    liar = listing([entry(invented, expires_at=1e12), entry(real, expires_at=50.0)])
    merged = merge_listings("symbol", [honest, honest, liar])
    # Listed more often wins over vouched for: the liar vouches for its own address.
    assert [(e["address"], e["listed_by"], e["vouched_by"]) for e in merged["roots"]] == [
        (real, 3, 1), (invented, 1, 1)]
    assert merged["roots"][0]["expires_at"] == 100.0  # the median: no member extends it
    assert not merged["roots"][0]["vouched"] and merged["roots"][1]["vouched"]
    # Equal counts: the order is the client's draw, not the addresses' (both orders occur),
    # so a liar cannot win ties by choosing its addresses.
    orders = {tuple(e["address"] for e in merge_listings(
        "symbol", [listing([entry(real)]), listing([entry(invented)])],
        random.Random(seed))["roots"]) for seed in range(20)}
    assert orders == {(real, invented), (invented, real)}


def test_an_address_listed_as_a_root_and_as_a_member_stays_in_both_lists():
    both = "10.0.0.2:1"
    merged = merge_listings("symbol", [listing([entry(both)]), listing([], [member(both)]),
                                       listing([], [member(both)])])
    assert [(e["address"], e["listed_by"], e["role"]) for e in merged["roots"]] == [
        (both, 1, "root")]
    assert [(e["address"], e["listed_by"], e["role"]) for e in merged["members"]] == [
        (both, 2, "subscriber")]
    assert merge_listings("symbol", []) == {"attribute": "symbol", "roots": [], "members": []}
