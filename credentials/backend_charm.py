"""Adapter for charm-crypto's PairingGroup, used when ``charm`` is importable.

charm needs the PBC C library, which this project's build machines cannot
install, so this adapter is exercised only where charm exists. Its curves are
not BLS12-381 and its hash is not RFC 9380 (the tag is prepended to the message):
keys and ciphertexts do not interoperate with the mcl backend. charm has no
constant-time multiplication, so secret exponents use its ordinary one.
"""

from __future__ import annotations

from typing import Any

from ibe_pubsub.credentials.groups import G1, G2, GT, GroupKind, PairingGroup


class CharmGroup(PairingGroup):
    name = "charm"

    def __init__(self, curve: str = "BN254") -> None:
        super().__init__()
        from charm.toolbox.pairinggroup import G1 as C_G1
        from charm.toolbox.pairinggroup import G2 as C_G2
        from charm.toolbox.pairinggroup import GT as C_GT
        from charm.toolbox.pairinggroup import ZR
        from charm.toolbox.pairinggroup import PairingGroup as CharmPairingGroup

        self._charm = CharmPairingGroup(curve)
        self.curve = curve
        self._zr = ZR
        self._kinds = {G1: C_G1, G2: C_G2, GT: C_GT}
        self.order = int(self._charm.order())
        self._gens = {G1: self._charm.random(C_G1), G2: self._charm.random(C_G2)}
        self._gens[GT] = self._charm.pair_prod([self._gens[G1]], [self._gens[G2]])
        self.sizes = {k: len(self._serialize(k, v)) for k, v in self._gens.items()}
        self.scalar_size = len(self._charm.serialize(self._charm.init(ZR, 1)))

    def _scalar(self, k: int) -> Any:
        return self._charm.init(self._zr, k)

    def _generator(self, kind: GroupKind) -> Any:
        return self._gens[kind]

    def _identity(self, kind: GroupKind) -> Any:
        return self._charm.init(self._kinds[kind], 1)

    def _hash_to_g1(self, data: bytes, dst: bytes) -> Any:
        return self._charm.hash(len(dst).to_bytes(2, "big") + dst + data, self._kinds[G1])

    def _exp_ct(self, kind: GroupKind, a: Any, k: int) -> Any:
        return self._op_exp(kind, a, k)

    def _prepare_g2(self, raw: Any) -> Any:
        return raw

    def _multi_pair(self, plain: list[tuple[Any, Any]], prepared: list[tuple[Any, Any]]) -> Any:
        pairs = plain + prepared
        return self._charm.pair_prod([a for a, _ in pairs], [b for _, b in pairs])

    def _multi_exp(self, kind: GroupKind, bases: list[Any], scalars: list[int]) -> Any:
        acc = self._identity(kind)
        for base, k in zip(bases, scalars, strict=True):
            acc = acc * base ** self._scalar(k)
        return acc

    def _op_mul(self, kind: GroupKind, a: Any, b: Any) -> Any:
        return a * b

    def _op_div(self, kind: GroupKind, a: Any, b: Any) -> Any:
        return a / b

    def _op_exp(self, kind: GroupKind, a: Any, k: int) -> Any:
        return a ** self._scalar(k)

    def _op_inv(self, kind: GroupKind, a: Any) -> Any:
        return a ** -1

    def _op_eq(self, kind: GroupKind, a: Any, b: Any) -> bool:
        return bool(a == b)

    def _serialize(self, kind: GroupKind, raw: Any) -> bytes:
        return bytes(self._charm.serialize(raw))

    def _deserialize(self, kind: GroupKind, data: bytes) -> Any | None:
        try:
            return self._charm.deserialize(data)
        except Exception:  # charm raises bare exceptions for malformed input
            return None
