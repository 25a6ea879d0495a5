"""Prefix-trie credentials for string attributes.

A string credential is a prefix (covers every value starting with it) or a
terminal (the end marker: exactly that value). The enclosing path of a value is
its prefixes, shortest first, then its terminal, so position = length (+1 for
the terminal).

Credentials look at no more than ``max_length`` characters: longer values and
prefixes are truncated for credentials only. Truncation over-approximates
(``symbol = "ABCDEFGHIJ"`` with max_length 8 yields the terminal "ABCDEFGH",
which also admits "ABCDEFGHXY"); the exact check after decryption uses the full
value, so nothing wrong is delivered.

Alphabet. With an ``alphabet`` in the schema, a prefix can be split into finer
credentials (its terminal plus one child per character). So that values with
characters outside the alphabet are still matched by such a split, credentials
fold every character outside the alphabet into one reserved character,
``OTHER_CHAR`` (U+FFFD), and the split has a child for it too. The split is then
complete: every value under the prefix lies under exactly one fine credential.
Folding over-approximates like truncation (``prefix "I-"`` also admits "I+"),
and the exact check removes the extras. Without an alphabet no split is
possible and ``fine_split`` returns the credential itself.
"""

from __future__ import annotations

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.exceptions import DecompositionError
from ibe_pubsub.credentials.schema import OTHER_CHAR, Attribute


def _check(attr: Attribute) -> int:
    if attr.type != "string" or attr.max_length is None:
        raise DecompositionError(f"attribute {attr.name!r} is not a string attribute")
    return attr.max_length


def credential_text(attr: Attribute, s: str) -> str:
    """The part of ``s`` that credentials see: truncated, outside-alphabet chars folded."""
    t = s[:_check(attr)]
    if attr.alphabet is None:
        return t
    allowed = attr.alphabet
    return "".join(ch if ch in allowed else OTHER_CHAR for ch in t)


def equality_credential(attr: Attribute, value: str) -> Credential:
    """``attr = value``: the terminal credential of the (truncated) value."""
    return Credential(attr.name, "str", credential_text(attr, value), terminal=True)


def prefix_credential(attr: Attribute, prefix: str) -> Credential:
    """``attr prefix p``: the non-terminal credential of the (truncated) prefix."""
    return Credential(attr.name, "str", credential_text(attr, prefix))


def enclosing_path(attr: Attribute, value: str) -> tuple[Credential, ...]:
    """Prefixes t[:0] .. t[:len(t)] then the terminal t (t = credential text of value)."""
    t = credential_text(attr, value)
    path = [Credential(attr.name, "str", t[:j]) for j in range(len(t) + 1)]
    path.append(Credential(attr.name, "str", t, terminal=True))
    return tuple(path)


def _split_once(attr: Attribute, cred: Credential) -> list[Credential]:
    max_length = _check(attr)
    if cred.terminal or attr.alphabet is None or len(cred.path) >= max_length:
        return [cred]
    children = [Credential(attr.name, "str", cred.path, terminal=True)]
    children += [Credential(attr.name, "str", cred.path + ch) for ch in attr.alphabet]
    children.append(Credential(attr.name, "str", cred.path + OTHER_CHAR))
    return children


def fine_split(attr: Attribute, cred: Credential, depth: int = 1) -> tuple[Credential, ...]:
    """Finer disjoint credentials that together cover exactly ``cred``, ``depth`` levels down.

    Terminal credentials, full-length prefixes and attributes without an
    alphabet cannot be split: the result is ``(cred,)``.
    """
    if cred.kind != "str" or cred.attribute != attr.name:
        raise DecompositionError(f"{cred} is not a credential of string attribute {attr.name!r}")
    if depth < 0:
        raise DecompositionError("depth must be >= 0")
    level = [cred]
    for _ in range(depth):
        level = [c for parent in level for c in _split_once(attr, parent)]
    return tuple(level)
