"""Choosing the pairing backend: mcl (BLS12-381) by default, charm on request."""

from __future__ import annotations

import functools
import os

from ibe_pubsub.credentials.groups import GroupError, PairingGroup

BACKEND_ENV = "IBE_PUBSUB_BACKEND"
BACKENDS = ("mcl", "charm")


@functools.cache
def load_group(name: str | None = None) -> PairingGroup:
    """The process-wide group of backend ``name`` (default: $IBE_PUBSUB_BACKEND or mcl).

    The mcl backend raises :class:`credentials.backend_mcl.NativeUnavailable`, saying
    why, when the bundled library lacks what the scheme needs (RFC 9380 hashing,
    constant-time multiplication): there is no slower fallback that computes the same
    bytes."""
    choice = name or os.environ.get(BACKEND_ENV, "mcl")
    if choice == "mcl":
        from ibe_pubsub.credentials.backend_mcl import MclNativeGroup

        return MclNativeGroup()
    if choice == "charm":
        from ibe_pubsub.credentials.backend_charm import CharmGroup

        return CharmGroup()
    raise GroupError(f"unknown pairing backend {choice!r}; choose one of {', '.join(BACKENDS)}")
