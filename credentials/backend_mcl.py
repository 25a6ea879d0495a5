"""The mcl backend: ctypes bindings to the C API bundled inside pymcl's extension.

pymcl's Python API lacks multi-pairings, Miller-loop precomputation, multi-scalar
and constant-time multiplication, and hashing under a domain tag; its shared
library exports mcl's C API, which has them. The library is initialised for
BLS12-381 by importing pymcl; we check the layout (6 limbs of 64 bits per Fp)
and every symbol we use before trusting it, then switch the library to the
interoperable conventions of the scheme: RFC 9380 hash-to-curve (map-to mode 5)
and the ZCash/IETF compressed point encodings (ETH serialization). Both are
process-wide settings of the library.

GT elements are encoded as the twelve Fp coefficients of Fp12 = Fp6[w]/(w^2 - v),
Fp6 = Fp2[v]/(v^3 - (u + 1)), Fp2 = Fp[u]/(u^2 + 1), in the order
c0.c0.c0, c0.c0.c1, c0.c1.c0, ..., c1.c2.c1, each 48 bytes little-endian (the
layout arkworks uses). mcl's ETH mode writes each Fp2 as c1 then c0, big-endian,
so each 96-byte Fp2 block is reversed on the way in and out.
"""

from __future__ import annotations

import ctypes
from types import MappingProxyType
from typing import Any

import pymcl

from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G1, G2, GT, GroupKind, PairingGroup

PYMCL_VERSION = "1.0.2"
#: Compressed encodings of BLS12-381: G1 and G2 points (ZCash/IETF), then GT.
BLS12_381_SIZES = MappingProxyType({G1: 48, G2: 96, GT: 576})
FP_BYTES = 48
#: The base field's modulus p: every coordinate of a canonical encoding lies below it.
FIELD_MODULUS = int("1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfff"
                    "eb153ffffb9feffffffffaaab", 16)
FP2_BYTES = 2 * FP_BYTES
RAW_SIZE = {G1: 3 * FP_BYTES, G2: 6 * FP_BYTES, GT: 12 * FP_BYTES}
FR_BYTES = 32
PREFIX = {G1: "mclBnG1", G2: "mclBnG2", GT: "mclBnGT"}
REQUIRED_SYMBOLS = (
    "mclBn_getOpUnitSize", "mclBn_getCurveType", "mclBn_getUint64NumToPrecompute",
    "mclBn_millerLoopVec", "mclBn_finalExp", "mclBn_precomputeG2",
    "mclBn_precomputedMillerLoop", "mclBn_verifyOrderG1", "mclBn_verifyOrderG2",
    "mclBnFr_setLittleEndianMod", "mclBnG1_hashAndMapToWithDst", "mclBnG1_mulVec",
    "mclBn_setETHserialization", "mclBn_setMapToMode", "mclBnG1_mulCT", "mclBnG2_mulCT",
    "mclBnG2_mulVec", "mclBnGT_pow", "mclBnGT_mul", "mclBnGT_div", "mclBnGT_inv",
    "mclBnGT_isEqual", "mclBnGT_isValid", "mclBnGT_serialize", "mclBnGT_deserialize",
    "mclBnGT_setInt32",
    *(f"{PREFIX[k]}_{op}" for k in (G1, G2) for op in (
        "add", "sub", "mul", "neg", "isEqual", "serialize", "deserialize", "clear")),
)
MCL_BLS12_381 = 5
#: mcl's map-to mode for RFC 9380 (``MCL_MAP_TO_MODE_HASH_TO_CURVE``).
MAP_TO_HASH_TO_CURVE = 5


#: The standard generators of BLS12-381 in the ZCash compressed encoding.
G1_GENERATOR = ("97f1d3a73197d7942695638c4fa9ac0fc3688c4f9774b905a14e3a3f171bac58"
                "6c55e83ff97a1aeffb3af00adb22c6bb")
G2_GENERATOR = ("93e02b6052719f607dacd3a088274f65596bd0d09920b61ab5da61bbdc7f5049"
                "334cf11213945d57e5ac7d055d042b7e024aa2b2f08f0a91260805272dc51051"
                "c6e47ad4fa403b02b4510b647ae3d1770bac0326a805bbefd48056c8c121bdb8")


class NativeUnavailable(CredentialsError, RuntimeError):
    """The bundled library does not offer the C API this backend needs."""


class NativeCallFailed(CredentialsError, RuntimeError):
    """A call into the bundled library reported failure."""


def _load_library() -> ctypes.CDLL:
    if pymcl.__version__ != PYMCL_VERSION:
        raise NativeUnavailable(f"pymcl {pymcl.__version__} is not the pinned {PYMCL_VERSION}")
    lib = ctypes.CDLL(pymcl._pymcl.__file__)
    missing = [name for name in REQUIRED_SYMBOLS if not hasattr(lib, name)]
    if missing:
        raise NativeUnavailable(f"mcl C API symbols missing: {', '.join(missing)}")
    if lib.mclBn_getOpUnitSize() != FP_BYTES // 8 or lib.mclBn_getCurveType() != MCL_BLS12_381:
        raise NativeUnavailable("bundled mcl is not built for BLS12-381 with 384-bit Fp")
    lib.mclBn_verifyOrderG1(1)
    lib.mclBn_verifyOrderG2(1)
    lib.mclBn_setETHserialization(1)
    if lib.mclBn_setMapToMode(MAP_TO_HASH_TO_CURVE) != 0:
        raise NativeUnavailable("bundled mcl does not offer RFC 9380 hash-to-curve")
    return lib


def _swap_fp2_blocks(data: bytes) -> bytes:
    """mcl's GT bytes <-> ours: every 96-byte Fp2 block reversed (an involution)."""
    return b"".join(data[i:i + FP2_BYTES][::-1] for i in range(0, len(data), FP2_BYTES))


def _raw(kind: GroupKind) -> Any:
    return (ctypes.c_ubyte * RAW_SIZE[kind])()


class MclNativeGroup(PairingGroup):
    """BLS12-381 through mcl's C API: native multi-pairings, multi-exponentiations and
    constant-time multiplication."""

    name = "mcl-native"
    curve = "BLS12-381"
    order = pymcl.r
    sizes = BLS12_381_SIZES
    scalar_size = FR_BYTES

    def __init__(self) -> None:
        super().__init__()
        self.lib = _load_library()
        self._precompute_words = self.lib.mclBn_getUint64NumToPrecompute()
        self._generators = {
            G1: self._deserialize(G1, bytes.fromhex(G1_GENERATOR)),
            G2: self._deserialize(G2, bytes.fromhex(G2_GENERATOR)),
        }
        if self._generators[G1] is None or self._generators[G2] is None:
            raise NativeUnavailable("cannot load the standard generators")
        self._generators[GT] = self._multi_pair([(self._generators[G1], self._generators[G2])],
                                                [])

    def _fr(self, k: int) -> Any:
        fr = (ctypes.c_ubyte * FR_BYTES)()
        self.lib.mclBnFr_setLittleEndianMod(fr, k.to_bytes(FR_BYTES, "little"), FR_BYTES)
        return fr

    def _generator(self, kind: GroupKind) -> Any:
        return self._generators[kind]

    def _identity(self, kind: GroupKind) -> Any:
        out = _raw(kind)
        if kind is GT:
            self.lib.mclBnGT_setInt32(out, 1)
        else:
            getattr(self.lib, f"{PREFIX[kind]}_clear")(out)
        return out

    def _hash_to_g1(self, data: bytes, dst: bytes) -> Any:
        out = _raw(G1)
        if self.lib.mclBnG1_hashAndMapToWithDst(out, data, len(data), dst, len(dst)) != 0:
            raise NativeCallFailed("mclBnG1_hashAndMapToWithDst failed")
        return out

    def _exp_ct(self, kind: GroupKind, a: Any, k: int) -> Any:
        out = _raw(kind)
        getattr(self.lib, f"{PREFIX[kind]}_mulCT")(out, a, self._fr(k))
        return out

    def _prepare_g2(self, raw: Any) -> Any:
        table = (ctypes.c_uint64 * self._precompute_words)()
        self.lib.mclBn_precomputeG2(table, raw)
        return table

    def _multi_pair(self, plain: list[tuple[Any, Any]], prepared: list[tuple[Any, Any]]) -> Any:
        acc = _raw(GT)
        self.lib.mclBnGT_setInt32(acc, 1)
        if plain:
            xs = (ctypes.c_ubyte * (RAW_SIZE[G1] * len(plain)))()
            ys = (ctypes.c_ubyte * (RAW_SIZE[G2] * len(plain)))()
            for i, (a, b) in enumerate(plain):
                ctypes.memmove(ctypes.byref(xs, i * RAW_SIZE[G1]), a, RAW_SIZE[G1])
                ctypes.memmove(ctypes.byref(ys, i * RAW_SIZE[G2]), b, RAW_SIZE[G2])
            self.lib.mclBn_millerLoopVec(acc, xs, ys, len(plain))
        step = _raw(GT)
        for a, table in prepared:
            self.lib.mclBn_precomputedMillerLoop(step, a, table)
            self.lib.mclBnGT_mul(acc, acc, step)
        out = _raw(GT)
        self.lib.mclBn_finalExp(out, acc)
        return out

    def _multi_exp(self, kind: GroupKind, bases: list[Any], scalars: list[int]) -> Any:
        size = RAW_SIZE[kind]
        xs = (ctypes.c_ubyte * (size * len(bases)))()
        ys = (ctypes.c_ubyte * (FR_BYTES * len(bases)))()
        for i, (base, k) in enumerate(zip(bases, scalars, strict=True)):
            ctypes.memmove(ctypes.byref(xs, i * size), base, size)
            ctypes.memmove(ctypes.byref(ys, i * FR_BYTES), self._fr(k), FR_BYTES)
        out = _raw(kind)
        getattr(self.lib, f"{PREFIX[kind]}_mulVec")(out, xs, ys, len(bases))
        return out

    def _op_mul(self, kind: GroupKind, a: Any, b: Any) -> Any:
        out = _raw(kind)
        getattr(self.lib, f"{PREFIX[kind]}_{'mul' if kind is GT else 'add'}")(out, a, b)
        return out

    def _op_div(self, kind: GroupKind, a: Any, b: Any) -> Any:
        out = _raw(kind)
        getattr(self.lib, f"{PREFIX[kind]}_{'div' if kind is GT else 'sub'}")(out, a, b)
        return out

    def _op_exp(self, kind: GroupKind, a: Any, k: int) -> Any:
        out = _raw(kind)
        getattr(self.lib, f"{PREFIX[kind]}_{'pow' if kind is GT else 'mul'}")(out, a, self._fr(k))
        return out

    def _op_inv(self, kind: GroupKind, a: Any) -> Any:
        out = _raw(kind)
        getattr(self.lib, f"{PREFIX[kind]}_{'inv' if kind is GT else 'neg'}")(out, a)
        return out

    def _op_eq(self, kind: GroupKind, a: Any, b: Any) -> bool:
        return bool(getattr(self.lib, f"{PREFIX[kind]}_isEqual")(a, b))

    def _serialize(self, kind: GroupKind, raw: Any) -> bytes:
        buf = (ctypes.c_ubyte * self.sizes[kind])()
        n = getattr(self.lib, f"{PREFIX[kind]}_serialize")(buf, len(buf), raw)
        if n != self.sizes[kind]:
            raise NativeCallFailed(f"{kind.value} serialization failed")
        return _swap_fp2_blocks(bytes(buf)) if kind is GT else bytes(buf)

    def _deserialize(self, kind: GroupKind, data: bytes) -> Any | None:
        """With verifyOrder set (at load), mcl's deserializer itself rejects points off the
        curve or outside the prime-order subgroup; GT elements are checked explicitly."""
        out = _raw(kind)
        if kind is GT:
            data = _swap_fp2_blocks(data)
        n = getattr(self.lib, f"{PREFIX[kind]}_deserialize")(out, data, len(data))
        if n != len(data):
            return None
        if kind is GT and not self.lib.mclBnGT_isValid(out):
            return None
        return out
