"""Fallback backend on pymcl's Python API: same curve and encodings, no native multi-pairing.

Used when the C API of the bundled library cannot be bound. A multi-pairing
becomes a product of single pairings, so it is several times slower.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pymcl

from credentials.groups import G1, G2, GT, GroupKind, PairingGroup

_CLASSES = {G1: pymcl.G1, G2: pymcl.G2, GT: pymcl.GT}
#: Compressed encodings of BLS12-381 in mcl: G1 and G2 points, then GT.
BLS12_381_SIZES = MappingProxyType({G1: 48, G2: 96, GT: 576})


class PymclGroup(PairingGroup):
    name = "pymcl"
    curve = "BLS12-381"
    order = pymcl.r
    sizes = BLS12_381_SIZES
    scalar_size = 32

    def _generator(self, kind: GroupKind) -> Any:
        return {G1: pymcl.g1, G2: pymcl.g2, GT: pymcl.pairing(pymcl.g1, pymcl.g2)}[kind]

    def _identity(self, kind: GroupKind) -> Any:
        return pymcl.GT() if kind is GT else _CLASSES[kind]()

    def _hash_to_g1(self, data: bytes) -> Any:
        return pymcl.G1.hash(data)

    def _prepare_g2(self, raw: Any) -> Any:
        return raw

    def _multi_pair(self, plain: list[tuple[Any, Any]], prepared: list[tuple[Any, Any]]) -> Any:
        acc = pymcl.GT()
        for a, b in plain + prepared:
            acc = acc * pymcl.pairing(a, b)
        return acc

    def _multi_exp(self, kind: GroupKind, bases: list[Any], scalars: list[int]) -> Any:
        acc = _CLASSES[kind]()
        for base, k in zip(bases, scalars, strict=True):
            acc = acc + base * pymcl.Fr(str(k))
        return acc

    def _op_mul(self, kind: GroupKind, a: Any, b: Any) -> Any:
        return a * b if kind is GT else a + b

    def _op_div(self, kind: GroupKind, a: Any, b: Any) -> Any:
        return a / b if kind is GT else a - b

    def _op_exp(self, kind: GroupKind, a: Any, k: int) -> Any:
        return a ** pymcl.Fr(str(k)) if kind is GT else a * pymcl.Fr(str(k))

    def _op_inv(self, kind: GroupKind, a: Any) -> Any:
        return ~a if kind is GT else -a

    def _op_eq(self, kind: GroupKind, a: Any, b: Any) -> bool:
        return bool(a == b)

    def _serialize(self, kind: GroupKind, raw: Any) -> bytes:
        return bytes(raw.serialize())

    def _deserialize(self, kind: GroupKind, data: bytes) -> Any | None:
        try:
            return _CLASSES[kind].deserialize(data)
        except (ValueError, RuntimeError):
            return None
