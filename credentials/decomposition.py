"""From predicates to credentials, and from event values to their credential paths.

A subscription (or a publisher's advertisement) becomes, per schema attribute,
a set of disjoint credentials whose union covers what the predicate selects on
that attribute; keys are issued per credential. An event value becomes its
enclosing path; a key opens the ciphertext entry at its credential's position
iff that entry's credential equals it, which is what ``covering_credential``
finds without any cryptography.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ibe_pubsub.credentials import numeric, policy_regions, strings
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.exceptions import DecompositionError
from ibe_pubsub.credentials.predicates import Constraint, NumericRange, Predicate, StringConstraint
from ibe_pubsub.credentials.schema import Attribute, Schema


def root_credential(attr: Attribute) -> Credential:
    """The whole-domain credential of an attribute (position 0)."""
    return Credential(attr.name, attr.kind, "")


def attribute_credentials(attr: Attribute, constraint: Constraint | None,
                          max_credentials: int | None = None,
                          policy: Constraint | None = None) -> tuple[Credential, ...]:
    """Disjoint credentials covering what ``constraint`` selects on ``attr``.

    With a ``policy`` constraint every credential lies inside it: a numeric cover
    is cut to the policy's inner cells, a string credential must fit as it is
    (``policy_regions``; OutsidePolicy where that cannot be done).
    """
    if attr.is_numeric:
        if isinstance(constraint, StringConstraint) or isinstance(policy, StringConstraint):
            raise DecompositionError(f"string constraint on numeric attribute {attr.name!r}")
        if policy is not None:
            return policy_regions.numeric_within(attr, constraint, policy, max_credentials)
        if constraint is None:
            return (root_credential(attr),)
        c = constraint
        return numeric.range_credentials(attr, c.lo, c.hi, c.lo_open, c.hi_open, max_credentials)
    if isinstance(constraint, NumericRange) or isinstance(policy, NumericRange):
        raise DecompositionError(f"numeric constraint on string attribute {attr.name!r}")
    if constraint is None:
        cred = root_credential(attr)
    elif constraint.equals is not None:
        cred = strings.equality_credential(attr, constraint.equals)
    else:
        cred = strings.prefix_credential(attr, constraint.prefix)  # type: ignore[arg-type]
    return (cred if policy is None else policy_regions.string_within(attr, cred, policy),)


def decompose(schema: Schema, predicate: Predicate, max_credentials: int | None = None,
              policy: Predicate | None = None) -> dict[str, tuple[Credential, ...]]:
    """One entry per schema attribute, in schema order (unconstrained -> root credential).

    ``max_credentials`` caps the credentials per numeric attribute by coarsening
    the cover (a superset); string constraints always yield one credential.
    With a ``policy`` (an identity's), every credential lies inside the policy's
    region and coarsening stays there; OutsidePolicy if the request cannot be met.
    """
    return {a.name: attribute_credentials(a, predicate.get(a.name), max_credentials,
                                          None if policy is None else policy.get(a.name))
            for a in schema.attributes}


def virtual_peer_credentials(schema: Schema, credentials: Iterable[Credential]
                             ) -> list[Credential]:
    """The credentials that become virtual peers, in schema order: every constrained one,
    else the first attribute's whole-domain credential. Their attributes are the trees a
    subscriber joins, which the key server lets it look up."""
    creds = list(credentials)
    chosen = [c for name in schema.names for c in creds
              if c.attribute == name and not c.is_root]
    return chosen or [c for c in creds if c.attribute == schema.names[0]][:1]


def enclosing_path(schema: Schema, attribute_name: str, value: Any) -> tuple[Credential, ...]:
    """The credentials enclosing an event value, root first; index = position."""
    attr = schema.attribute(attribute_name)
    if attr.is_numeric:
        return numeric.enclosing_path(attr, value)
    return strings.enclosing_path(attr, value)


def value_credential(schema: Schema, attribute_name: str, value: Any) -> Credential:
    """The finest credential enclosing a value (the last entry of its enclosing path)."""
    attr = schema.attribute(attribute_name)
    if attr.is_numeric:
        return Credential(attr.name, "num", numeric.value_bits(attr, value))
    return Credential(attr.name, "str", strings.credential_text(attr, value), terminal=True)


def event_paths(schema: Schema, values: Mapping[str, Any]) -> dict[str, tuple[Credential, ...]]:
    """Enclosing paths of every attribute of a (validated) event, in schema order."""
    return {a.name: enclosing_path(schema, a.name, values[a.name]) for a in schema.attributes}


def fine_split(schema: Schema, cred: Credential, depth: int = 1) -> tuple[Credential, ...]:
    """Finer disjoint credentials covering exactly ``cred`` (report 7.4)."""
    attr = schema.attribute(cred.attribute)
    if attr.is_numeric:
        return numeric.fine_split(attr, cred, depth)
    return strings.fine_split(attr, cred, depth)


def fine_credentials(schema: Schema,
                     credentials: Mapping[str, Iterable[Credential]] | Iterable[Credential],
                     depth: int = 1) -> dict[str, tuple[Credential, ...]]:
    """Fine-granular credentials per attribute, for multi-credential routing tokens.

    Accepts the output of ``decompose`` or a flat iterable of credentials.
    """
    flat: Iterable[Credential]
    if isinstance(credentials, Mapping):
        flat = (c for creds in credentials.values() for c in creds)
    else:
        flat = credentials
    out: dict[str, list[Credential]] = {}
    for cred in flat:
        out.setdefault(cred.attribute, []).extend(fine_split(schema, cred, depth))
    return {name: tuple(out[name]) for name in schema.names if name in out}


def covering_credential(credentials: Iterable[Credential],
                        value_path: tuple[Credential, ...]) -> Credential | None:
    """The credential among ``credentials`` that encloses the value, or None.

    Checks only the path entry at each credential's position, as decryption
    does. Decompositions are disjoint, so at most one credential matches.
    """
    for cred in credentials:
        pos = cred.position
        if pos < len(value_path) and value_path[pos] == cred:
            return cred
    return None
