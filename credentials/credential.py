"""A credential: one node of an attribute's containment hierarchy.

Numeric attributes: a dyadic subspace named by a bit string ("" is the whole
domain). String attributes: a node of the prefix trie, a prefix, optionally
closed by the end marker (``terminal``) which stands for "exactly this value".
Containment is the prefix relation; the position of a credential on the path of
an event value is its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ibe_pubsub.credentials.exceptions import CredentialsError

Kind = Literal["num", "str"]
END_MARKER = "$"


class CredentialFormatError(CredentialsError, ValueError):
    """A credential, its encoding or its label that is not well formed."""


@dataclass(frozen=True, order=True)
class Credential:
    attribute: str
    kind: Kind
    path: str
    terminal: bool = False

    def __post_init__(self) -> None:
        if self.kind == "num":
            if self.terminal or self.path.strip("01"):
                raise CredentialFormatError(
                    f"numeric credential needs a bit string, got {self.path!r}")
        elif self.kind != "str":
            raise CredentialFormatError(f"unknown credential kind {self.kind!r}")

    @property
    def position(self) -> int:
        """Index on the path of enclosing credentials (root = 0)."""
        return len(self.path) + (1 if self.terminal else 0)

    @property
    def is_root(self) -> bool:
        return self.position == 0

    def covers(self, other: Credential) -> bool:
        """True iff every value enclosed by ``other`` is enclosed by this credential."""
        if (self.attribute, self.kind) != (other.attribute, other.kind):
            return False
        if self.terminal:
            return other == self
        return other.path.startswith(self.path)

    def ancestors(self) -> tuple[Credential, ...]:
        """Every credential that covers this one, itself included, ordered by position."""
        chain = [Credential(self.attribute, self.kind, self.path[:n])
                 for n in range(len(self.path) + 1)]
        if self.terminal:
            chain.append(self)
        return tuple(chain)

    def encode(self) -> bytes:
        """Unambiguous byte form used inside identity strings and on the wire."""
        marker = b"\x01" if self.terminal else b"\x00"
        return self.kind.encode() + marker + self.path.encode("utf-8")

    @classmethod
    def decode(cls, attribute: str, data: bytes) -> Credential:
        if len(data) < 4 or data[3] not in (0, 1):
            raise CredentialFormatError("malformed credential encoding")
        kind = data[:3].decode("ascii", errors="replace")
        if kind not in ("num", "str"):
            raise CredentialFormatError(f"unknown credential kind {kind!r}")
        try:
            path = data[4:].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CredentialFormatError("credential path is not UTF-8") from exc
        return cls(attribute, kind, path, terminal=data[3] == 1)  # type: ignore[arg-type]

    def label(self) -> str:
        """The label as printed: ``price:0110``, ``symbol:"IB"``, ``symbol:"IBM"$``."""
        if self.kind == "num":
            return f"{self.attribute}:{self.path or '*'}"
        quoted = '"' + self.path.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return f"{self.attribute}:{quoted}{END_MARKER if self.terminal else ''}"

    @classmethod
    def from_label(cls, label: str) -> Credential:
        """Parse what :meth:`label` prints; raises ValueError on anything else."""
        attribute, sep, rest = label.partition(":")
        if not sep or not attribute:
            raise CredentialFormatError(f"credential label {label!r} has no attribute")
        if not rest.startswith('"'):
            return cls(attribute, "num", "" if rest == "*" else rest)
        terminal = rest.endswith('"' + END_MARKER)
        body = rest[1:-2] if terminal else rest[1:-1]
        if not rest.endswith('"', 0, len(rest) - (1 if terminal else 0)) or len(rest) < 2:
            raise CredentialFormatError(f"credential label {label!r} has an unterminated string")
        path, i = [], 0
        while i < len(body):
            if body[i] == "\\" and i + 1 < len(body):
                path.append(body[i + 1])
                i += 2
            elif body[i] in '"\\':
                raise CredentialFormatError(f"credential label {label!r} has an unescaped quote")
            else:
                path.append(body[i])
                i += 1
        return cls(attribute, "str", "".join(path), terminal=terminal)

    def __str__(self) -> str:
        return self.label()
