"""The native backend's parsing: only canonical elements of the prime-order groups pass."""

from __future__ import annotations

import pytest

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.groups import G1, G2, GT, GroupError
from ibe_pubsub.credentials.vectors import point_outside_subgroup


def test_points_outside_the_subgroup_are_rejected():
    group = load_group("mcl")
    group.lib.mclBn_verifyOrderG1(0)
    try:
        assert group._deserialize(G1, point_outside_subgroup(G1)) is not None, \
            "the test point must lie on the curve"
    finally:
        group.lib.mclBn_verifyOrderG1(1)
    with pytest.raises(GroupError):
        group.deserialize(G1, point_outside_subgroup(G1))


def test_malformed_encodings_are_rejected():
    group = load_group("mcl")
    g1 = bytes(group.hash_to_g1(b"x", b"TEST-DST"))
    for kind, data in [(G1, g1[:-1]), (G1, b"\xff" * 48), (G1, bytes(group.identity(G1))),
                       (G2, bytes(group.identity(G2))), (G2, g1 + g1),
                       (GT, b"\x01" * 576)]:
        with pytest.raises(GroupError):
            group.deserialize(kind, data)
    assert group.deserialize(G1, g1) == group.hash_to_g1(b"x", b"TEST-DST")


def test_refuses_a_library_without_the_c_api_the_scheme_needs(monkeypatch):
    import pymcl

    from ibe_pubsub.credentials.backend_mcl import NativeUnavailable
    from ibe_pubsub.credentials.backends import load_group as cached_load_group

    monkeypatch.setattr(pymcl, "__version__", "0.0.0")  # not the pinned build
    cached_load_group.cache_clear()
    try:
        with pytest.raises(NativeUnavailable, match="not the pinned"):
            cached_load_group("mcl")
    finally:
        cached_load_group.cache_clear()  # the next caller binds the native library again
