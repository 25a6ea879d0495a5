"""The event-space schema: which attributes an event has, their types and domains.

Every peer and the key server must agree on the schema bit for bit, because the
attribute order indexes the ciphertext and the numeric quantization decides
which credential encloses a value. The schema is therefore self-certifying: its
id is the SHA-256 of a canonical serialization, so a schema that was tampered
with simply has a different id.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ibe_pubsub.credentials.exceptions import CredentialsError

AttrType = Literal["string", "int", "float"]
TYPES: tuple[str, ...] = ("string", "int", "float")
# The predicate language uses these words; an attribute named like them would be ambiguous.
RESERVED_NAMES = frozenset({"and", "in", "prefix"})
MAX_BITS = 32
#: Where a string credential's path has a character outside its attribute's alphabet
#: (U+FFFD): reserved, so no alphabet may contain it.
OTHER_CHAR = "\ufffd"


class SchemaError(CredentialsError, ValueError):
    """A schema or an event does not conform; the message says which attribute and why."""


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class Attribute:
    """One attribute of the event space.

    Numeric attributes (``int``/``float``) carry ``min``, ``max`` and ``bits``: the
    closed domain [min, max] is quantized into ``2**bits`` cells. String attributes
    carry ``max_length`` (credentials use at most that many characters) and an
    optional ``alphabet`` that makes fine-granular splits of prefixes possible.
    """

    name: str
    type: AttrType
    min: int | float | None = None
    max: int | float | None = None
    bits: int | None = None
    max_length: int | None = None
    alphabet: str | None = None

    def __post_init__(self) -> None:
        if self.type == "float":  # accept ints for a float domain, store floats
            for key in ("min", "max"):
                v = getattr(self, key)
                if _is_number(v):
                    object.__setattr__(self, key, float(v))
        _check_attribute(self)

    @property
    def kind(self) -> Literal["num", "str"]:
        """The credential kind for this attribute."""
        return "str" if self.type == "string" else "num"

    @property
    def is_numeric(self) -> bool:
        return self.type != "string"

    @property
    def positions(self) -> int:
        """Length of every enclosing path, so of every ciphertext list and connection
        request of this attribute: the root, then one position per bit (numeric) or per
        character and the end marker (string)."""
        return self.bits + 1 if self.is_numeric else self.max_length + 2

    @property
    def cells(self) -> int:
        """Number of leaf cells of a numeric attribute."""
        if self.bits is None:
            raise SchemaError(f"attribute {self.name!r} is not numeric")
        return 1 << self.bits

    def to_dict(self) -> dict[str, Any]:
        """Normalized fields only (those that matter for credentials)."""
        if self.type == "string":
            d: dict[str, Any] = {"name": self.name, "type": self.type,
                                 "max_length": self.max_length}
            if self.alphabet is not None:
                d["alphabet"] = self.alphabet
            return d
        return {"name": self.name, "type": self.type, "min": self.min, "max": self.max,
                "bits": self.bits}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Attribute:
        """Build from a TOML table / JSON object; unknown keys are ignored."""
        if not isinstance(d, Mapping):
            raise SchemaError(f"an attribute must be a table, got {type(d).__name__}")
        name = d.get("name")
        if not isinstance(name, str):
            raise SchemaError(f"attribute name must be a string, got {name!r}")
        typ = d.get("type")
        if typ not in TYPES:
            raise SchemaError(
                f"attribute {name!r}: unknown type {typ!r} (expected one of {', '.join(TYPES)})")
        if typ == "string":
            return cls(name, "string", max_length=d.get("max_length"),
                       alphabet=d.get("alphabet"))
        for key in ("min", "max", "bits"):
            if key not in d:
                raise SchemaError(f"attribute {name!r}: numeric attribute needs {key!r}")
        return cls(name, typ, min=d["min"], max=d["max"], bits=d["bits"])


def _check_attribute(a: Attribute) -> None:
    where = f"attribute {a.name!r}"
    if not isinstance(a.name, str) or not a.name.isidentifier():
        raise SchemaError(f"{where}: name must be an identifier")
    if a.name in RESERVED_NAMES:
        raise SchemaError(f"{where}: name is a reserved word of the predicate language")
    if a.type not in TYPES:
        raise SchemaError(f"{where}: unknown type {a.type!r} (expected one of {', '.join(TYPES)})")
    if a.type == "string":
        if a.min is not None or a.max is not None or a.bits is not None:
            raise SchemaError(f"{where}: a string attribute has no min/max/bits")
        if not isinstance(a.max_length, int) or isinstance(a.max_length, bool):
            raise SchemaError(f"{where}: string attribute needs an integer max_length")
        if a.max_length < 1:
            raise SchemaError(f"{where}: max_length must be at least 1, got {a.max_length}")
        if a.alphabet is not None:
            _check_alphabet(where, a.alphabet)
        return
    if a.max_length is not None or a.alphabet is not None:
        raise SchemaError(f"{where}: a numeric attribute has no max_length/alphabet")
    if a.type == "int":
        for key, v in (("min", a.min), ("max", a.max)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise SchemaError(f"{where}: {key} of an int attribute must be an integer")
    else:
        for key, v in (("min", a.min), ("max", a.max)):
            if not isinstance(v, float) or not math.isfinite(v):
                raise SchemaError(f"{where}: {key} of a float attribute must be a finite number")
    if not a.min < a.max:  # type: ignore[operator]
        raise SchemaError(f"{where}: min ({a.min}) must be smaller than max ({a.max})")
    if not isinstance(a.bits, int) or isinstance(a.bits, bool) or not 1 <= a.bits <= MAX_BITS:
        raise SchemaError(f"{where}: bits must be an integer in 1..{MAX_BITS}, got {a.bits!r}")


def _check_alphabet(where: str, alphabet: object) -> None:
    if not isinstance(alphabet, str) or not alphabet:
        raise SchemaError(f"{where}: alphabet must be a non-empty string")
    if len(set(alphabet)) != len(alphabet):
        raise SchemaError(f"{where}: alphabet has repeated characters")
    if OTHER_CHAR in alphabet:
        raise SchemaError(f"{where}: alphabet must not contain U+FFFD (reserved)")


@dataclass(frozen=True)
class Schema:
    """A named, ordered tuple of attributes; the order indexes the ciphertext."""

    name: str
    attributes: tuple[Attribute, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError("schema name must be a non-empty string")
        if not self.attributes:
            raise SchemaError(f"schema {self.name!r} has no attributes")
        seen: set[str] = set()
        for a in self.attributes:
            if a.name in seen:
                raise SchemaError(f"schema {self.name!r}: duplicate attribute {a.name!r}")
            seen.add(a.name)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def attribute(self, name: str) -> Attribute:
        """The attribute called ``name``; SchemaError if the schema has none."""
        for a in self.attributes:
            if a.name == name:
                return a
        raise SchemaError(
            f"schema {self.name!r} has no attribute {name!r} "
            f"(attributes: {', '.join(self.names)})")

    def index(self, name: str) -> int:
        """Position of the attribute in the schema (and in the ciphertext)."""
        return self.attributes.index(self.attribute(name))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "attributes": [a.to_dict() for a in self.attributes]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schema:
        """Build and validate from a parsed TOML/JSON document; unknown keys are ignored."""
        if not isinstance(d, Mapping):
            raise SchemaError("a schema must be a table")
        attrs = d.get("attributes")
        if not isinstance(attrs, list):
            raise SchemaError("schema needs an 'attributes' array of tables")
        return cls(d.get("name"), tuple(Attribute.from_dict(a) for a in attrs))  # type: ignore[arg-type]

    def canonical_bytes(self) -> bytes:
        """Sorted-key compact JSON of the normalized fields: the input of the id."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False).encode("utf-8")

    @cached_property
    def id(self) -> str:
        """Hex SHA-256 of the canonical form, so the schema certifies itself (computed once:
        every event's credentials are checked against it)."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    def validate_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Check an event's values against the schema; returns them in schema order.

        Every attribute must be present and no other; ints for ``int``, ints or
        floats for ``float`` (within [min, max]), str for ``string`` (any length:
        only credentials are truncated).
        """
        unknown = [k for k in values if k not in self.names]
        if unknown:
            raise SchemaError(f"unknown attribute {unknown[0]!r} in event "
                              f"(schema {self.name!r} has: {', '.join(self.names)})")
        out: dict[str, Any] = {}
        for a in self.attributes:
            if a.name not in values:
                raise SchemaError(f"attribute {a.name!r} is missing from the event")
            v = values[a.name]
            out[a.name] = v
            if a.type == "string":
                if not isinstance(v, str):
                    raise SchemaError(f"attribute {a.name!r} must be a string, "
                                      f"got {type(v).__name__}")
                continue
            ok = (isinstance(v, int) if a.type == "int" else _is_number(v)) \
                and not isinstance(v, bool)
            if not ok:
                want = "an int" if a.type == "int" else "a number"
                raise SchemaError(f"attribute {a.name!r} must be {want}, got {type(v).__name__}")
            if not a.min <= v <= a.max:  # type: ignore[operator]
                raise SchemaError(
                    f"attribute {a.name!r}: value {v!r} outside [{a.min}, {a.max}]")
        return out


def load_schema(path: str | Path) -> Schema:
    """Read and validate a schema TOML file (the only I/O of this package); a SchemaError
    names the file."""
    with open(path, "rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise SchemaError(f"{path}: not valid TOML: {exc}") from exc
        except UnicodeDecodeError:
            raise SchemaError(f"{path}: not UTF-8 text") from None
    try:
        return Schema.from_dict(doc)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from None


def schema_from_toml(text: str) -> Schema:
    """Parse and validate a schema given as TOML text."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SchemaError(f"not valid TOML: {exc}") from exc
    return Schema.from_dict(doc)


#: Schemas shipped inside the package, by the name ``--schema`` accepts instead of a path.
BUILTIN_SCHEMAS = ("stocks",)


def builtin_schema(name: str) -> Schema:
    """A schema shipped with the package, so commands work from any directory."""
    if name not in BUILTIN_SCHEMAS:
        raise SchemaError(f"no built-in schema {name!r} (built-in: {', '.join(BUILTIN_SCHEMAS)})")
    text = resources.files(__package__).joinpath(f"{name}.toml").read_text("utf-8")
    return schema_from_toml(text)


def default_schema() -> Schema:
    """The example ``stocks`` schema shipped with the package."""
    return builtin_schema("stocks")


def resolve_schema(name_or_path: str) -> Schema:
    """A built-in schema by name, else the schema TOML file at that path.

    A built-in name wins over a file of the same name in the working directory
    (``./stocks`` reaches the file). Every failure is one line naming the argument.
    """
    if name_or_path in BUILTIN_SCHEMAS:
        return builtin_schema(name_or_path)
    try:
        return load_schema(name_or_path)
    except FileNotFoundError:
        raise SchemaError(f"no schema file {name_or_path!r} and no built-in schema of that "
                          f"name (built-in: {', '.join(BUILTIN_SCHEMAS)})") from None
    except OSError as exc:
        raise SchemaError(f"cannot read the schema {name_or_path}: {exc.strerror}") from None
