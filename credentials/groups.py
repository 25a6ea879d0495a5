"""The pairing-group interface the scheme is written against, modeled on charm's PairingGroup.

Elements use multiplicative notation as the scheme (docs/scheme.md) does: ``a * b`` is the group
operation, ``a ** k`` exponentiation by an integer scalar, ``a / b`` and ``~a``
the inverse. Backends supply a handful of primitives on raw values; the
:class:`Element` wrapper is shared, so the scheme never sees a backend type.

Every backend counts its raw operations in :attr:`PairingGroup.counts`, which is
how the benchmark prices an algorithm at the floor of this library.
"""

from __future__ import annotations

import functools
import hashlib
import os
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from ibe_pubsub.credentials.exceptions import CredentialsError

#: Exponents up to this size (batch-verification weights) are counted as short exponentiations.
SHORT_EXPONENT_BITS = 128


class GroupKind(StrEnum):
    G1 = "G1"
    G2 = "G2"
    GT = "GT"


G1 = GroupKind.G1
G2 = GroupKind.G2
GT = GroupKind.GT


class GroupError(CredentialsError, ValueError):
    """Bytes that are not a valid, canonical element of the expected group."""


class Element:
    """A group element of one backend; immutable.

    An element decoded from the wire may be *unchecked*: it holds only its bytes, and is
    parsed (curve, subgroup and identity checks) the first time an operation needs it, so
    a router pays only for the elements it uses. A malformed one raises
    :class:`GroupError` at that point."""

    __slots__ = ("_encoded", "_raw", "group", "kind")

    def __init__(self, group: PairingGroup, kind: GroupKind, raw: Any,
                 encoded: bytes | None = None) -> None:
        self.group = group
        self.kind = kind
        self._raw = raw
        self._encoded = encoded

    @property
    def raw(self) -> Any:
        if self._raw is None:
            self._raw = self.group._parse(self.kind, self._encoded or b"")
        return self._raw

    def _same(self, other: Element) -> None:
        if not isinstance(other, Element) or other.kind is not self.kind:
            raise TypeError(f"cannot combine {self.kind.value} with {other!r}")

    def __mul__(self, other: Element) -> Element:
        self._same(other)
        return Element(self.group, self.kind, self.group._op_mul(self.kind, self.raw, other.raw))

    def __truediv__(self, other: Element) -> Element:
        self._same(other)
        return Element(self.group, self.kind, self.group._op_div(self.kind, self.raw, other.raw))

    def __pow__(self, scalar: int) -> Element:
        """Variable-time exponentiation: for public or batch-weight exponents only."""
        k = scalar % self.group.order
        short = "_short" if k.bit_length() <= SHORT_EXPONENT_BITS else ""
        self.group.counts[f"exp_{self.kind.value}{short}"] += 1
        return Element(self.group, self.kind, self.group._op_exp(self.kind, self.raw, k))

    def __invert__(self) -> Element:
        return Element(self.group, self.kind, self.group._op_inv(self.kind, self.raw))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Element) or other.kind is not self.kind:
            return NotImplemented
        return self.group._op_eq(self.kind, self.raw, other.raw)

    def __hash__(self) -> int:
        return hash((self.kind, bytes(self)))

    def __bytes__(self) -> bytes:
        """The canonical encoding, computed once: signing digests re-read whole events."""
        if self._encoded is None:
            self._encoded = self.group._serialize(self.kind, self._raw)
        return self._encoded

    def __repr__(self) -> str:
        return f"<{self.kind.value} {bytes(self)[:6].hex()}…>"


class PreparedG2:
    """A G2 element with its Miller-loop precomputation, for fixed arguments (ĝ, h, keys)."""

    __slots__ = ("element", "table")

    def __init__(self, element: Element, table: Any) -> None:
        self.element = element
        self.table = table


class PairingGroup(ABC):
    """A type-3 pairing e: G1 x G2 -> GT of prime order."""

    name: str
    #: The curve, as named in the master public key (several backends share one curve).
    curve: str
    order: int
    #: Byte sizes of serialized G1, G2, GT elements and scalars.
    sizes: Mapping[GroupKind, int]
    scalar_size: int

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        #: Source of every random byte the scheme draws: the OS by default; test vectors
        #: swap in a seeded generator (:meth:`seed`).
        self.random_bytes: Callable[[int], bytes] = os.urandom

    def seed(self, seed: bytes) -> None:
        """Draw every later random byte from SHAKE-256(seed) instead of the OS: for
        reproducible test vectors only, never for keys in use."""
        stream = hashlib.shake_256(b"ibe-pubsub test vectors" + seed)
        drawn = 0

        def deterministic(n: int) -> bytes:
            nonlocal drawn
            drawn += n
            return stream.digest(drawn)[drawn - n:]

        self.random_bytes = deterministic

    @functools.cached_property
    def _identities(self) -> dict[GroupKind, Element]:
        return {kind: self.identity(kind) for kind in (G1, G2)}

    # -- operations the scheme uses ------------------------------------------------------

    def random_scalar(self) -> int:
        """A random element of Zq* (never zero): 512 random bits reduced, bias < 2^-256."""
        return int.from_bytes(self.random_bytes(64), "big") % (self.order - 1) + 1

    def generator(self, kind: GroupKind) -> Element:
        return Element(self, kind, self._generator(kind))

    def identity(self, kind: GroupKind) -> Element:
        return Element(self, kind, self._identity(kind))

    def hash_to_g1(self, data: bytes, dst: bytes) -> Element:
        """Hash a byte string onto G1 under the domain separation tag ``dst``
        (RFC 9380 ``BLS12381G1_XMD:SHA-256_SSWU_RO_`` on BLS12-381)."""
        self.counts["hash_G1"] += 1
        return Element(self, G1, self._hash_to_g1(data, dst))

    def exp_secret(self, element: Element, scalar: int) -> Element:
        """``element ** scalar`` in constant time, for secret exponents (keys, encryption)."""
        if element.kind is GT:
            raise TypeError("constant-time exponentiation is offered in G1 and G2")
        self.counts[f"exp_{element.kind.value}_ct"] += 1
        return Element(self, element.kind,
                       self._exp_ct(element.kind, element.raw, scalar % self.order))

    def random_element(self, kind: GroupKind) -> Element:
        """A uniformly random element of G1 or G2 (padding that must look like the rest)."""
        return self.exp_secret(self.generator(kind), self.random_scalar())

    def prepare(self, element: Element) -> PreparedG2:
        """Precompute the Miller-loop lines of a G2 element that is paired often."""
        if element.kind is not G2:
            raise TypeError("only G2 elements can be prepared")
        return PreparedG2(element, self._prepare_g2(element.raw))

    def pair(self, a: Element, b: Element | PreparedG2) -> Element:
        return self.multi_pair([(a, b)])

    def multi_pair(self, pairs: Sequence[tuple[Element, Element | PreparedG2]]) -> Element:
        """prod_i e(a_i, b_i): one Miller loop per pair and a single final exponentiation."""
        plain: list[tuple[Any, Any]] = []
        prepared: list[tuple[Any, Any]] = []
        for a, b in pairs:
            if a.kind is not G1:
                raise TypeError("pairing needs G1 x G2")
            if isinstance(b, PreparedG2):
                prepared.append((a.raw, b.table))
            elif b.kind is G2:
                plain.append((a.raw, b.raw))
            else:
                raise TypeError("pairing needs G1 x G2")
        self.counts["miller_loop"] += len(plain)
        self.counts["miller_loop_prepared"] += len(prepared)
        self.counts["final_exp"] += 1
        return Element(self, GT, self._multi_pair(plain, prepared))

    def multi_exp(self, bases: Sequence[Element], scalars: Sequence[int]) -> Element:
        """prod_i base_i ** scalar_i in G1 or G2 (multi-scalar multiplication)."""
        if not bases or len(bases) != len(scalars):
            raise GroupError("multi_exp needs as many scalars as bases, at least one")
        kind = bases[0].kind
        if kind is GT or any(b.kind is not kind for b in bases):
            raise TypeError("multi_exp works in G1 or G2 on elements of one group")
        self.counts[f"multi_exp_{kind.value}_{len(bases)}"] += 1
        reduced = [k % self.order for k in scalars]
        return Element(self, kind, self._multi_exp(kind, [b.raw for b in bases], reduced))

    def serialize(self, element: Element) -> bytes:
        return bytes(element)

    def deserialize(self, kind: GroupKind, data: bytes) -> Element:
        """Parse a canonical encoding now; see :meth:`_parse` for what is rejected."""
        data = bytes(data)
        return Element(self, kind, self._parse(kind, data), encoded=data)

    def unchecked(self, kind: GroupKind, data: bytes) -> Element:
        """An element that is parsed and checked only when first used (see :class:`Element`);
        its length is checked now."""
        if len(data) != self.sizes[kind]:
            raise GroupError(
                f"{kind.value} element must be {self.sizes[kind]} bytes, got {len(data)}")
        return Element(self, kind, None, encoded=bytes(data))

    def _parse(self, kind: GroupKind, data: bytes) -> Any:
        """The raw element; rejects wrong lengths, points off the curve or outside the
        prime-order subgroup, non-canonical encodings and the identity of G1/G2.

        Every decoder goes through here. Backends accept some non-canonical spellings
        (mcl: the infinity flag with a non-zero last byte), so the element is re-encoded
        and compared: each element then has exactly one encoding, and comparing bytes
        with the identity's recognises every spelling of it."""
        if len(data) != self.sizes[kind]:
            raise GroupError(
                f"{kind.value} element must be {self.sizes[kind]} bytes, got {len(data)}")
        raw = self._deserialize(kind, data)
        if raw is None:
            raise GroupError(f"bytes are not a valid {kind.value} element")
        if self._serialize(kind, raw) != data:
            raise GroupError(f"bytes are a non-canonical encoding of a {kind.value} element")
        if kind is not GT and data == bytes(self._identities[kind]):
            raise GroupError(f"the identity of {kind.value} is not accepted")
        return raw

    # -- primitives a backend implements ---------------------------------------------------

    @abstractmethod
    def _generator(self, kind: GroupKind) -> Any: ...

    @abstractmethod
    def _identity(self, kind: GroupKind) -> Any: ...

    @abstractmethod
    def _hash_to_g1(self, data: bytes, dst: bytes) -> Any: ...

    @abstractmethod
    def _exp_ct(self, kind: GroupKind, a: Any, k: int) -> Any:
        """Constant-time ``a ** k`` in G1 or G2."""

    @abstractmethod
    def _prepare_g2(self, raw: Any) -> Any: ...

    @abstractmethod
    def _multi_pair(self, plain: list[tuple[Any, Any]], prepared: list[tuple[Any, Any]]) -> Any:
        ...

    @abstractmethod
    def _multi_exp(self, kind: GroupKind, bases: list[Any], scalars: list[int]) -> Any: ...

    @abstractmethod
    def _op_mul(self, kind: GroupKind, a: Any, b: Any) -> Any: ...

    @abstractmethod
    def _op_div(self, kind: GroupKind, a: Any, b: Any) -> Any: ...

    @abstractmethod
    def _op_exp(self, kind: GroupKind, a: Any, k: int) -> Any: ...

    @abstractmethod
    def _op_inv(self, kind: GroupKind, a: Any) -> Any: ...

    @abstractmethod
    def _op_eq(self, kind: GroupKind, a: Any, b: Any) -> bool: ...

    @abstractmethod
    def _serialize(self, kind: GroupKind, raw: Any) -> bytes: ...

    @abstractmethod
    def _deserialize(self, kind: GroupKind, data: bytes) -> Any | None:
        """The raw element, or None when the bytes are not a valid element."""
