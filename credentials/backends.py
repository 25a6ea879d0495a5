"""Choosing the pairing backend: native mcl by default, pymcl as fallback, charm on request."""

from __future__ import annotations

import functools
import os
import warnings

from credentials.groups import PairingGroup

BACKEND_ENV = "IBE_PUBSUB_BACKEND"
BACKENDS = ("mcl", "pymcl", "charm")


@functools.cache
def load_group(name: str | None = None) -> PairingGroup:
    """The process-wide group of backend ``name`` (default: $IBE_PUBSUB_BACKEND or mcl)."""
    choice = name or os.environ.get(BACKEND_ENV, "mcl")
    if choice == "mcl":
        from credentials.backend_mcl import MclNativeGroup, NativeUnavailable

        try:
            return MclNativeGroup()
        except NativeUnavailable as exc:
            warnings.warn(f"native mcl unavailable ({exc}); falling back to pymcl's Python API",
                          RuntimeWarning, stacklevel=2)
            choice = "pymcl"
    if choice == "pymcl":
        from credentials.backend_pymcl import PymclGroup

        return PymclGroup()
    if choice == "charm":
        from credentials.backend_charm import CharmGroup

        return CharmGroup()
    raise ValueError(f"unknown pairing backend {choice!r}; choose one of {', '.join(BACKENDS)}")
