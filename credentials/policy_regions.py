"""Credentials inside an identity's policy: the region a credential covers, checked and cut.

A credential encloses a region of values: a numeric credential every value of
its dyadic block of cells, a string credential every value whose credential
text (truncated to ``max_length``, characters outside the alphabet folded)
starts with its prefix, or equals it for a terminal. The key server may issue a
credential only if that whole region satisfies the policy: a key for a wider
region would decrypt (or sign) events the policy excludes.

So a policy's region is its inner approximation: on numeric attributes the
cells lying entirely inside its range (``numeric.inner_interval``; a cell that
straddles a bound is left out), on string attributes the credentials whose
every value has the policy's prefix (or is its value). A request is cut to that
region and coarsened only inside it, down to ``max_credentials`` blocks or, where the
policy's region cannot be covered with so few, to the fewest that can; where nothing
remains, the request is refused (``OutsidePolicy``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ibe_pubsub.credentials import numeric
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.predicates import Constraint, NumericRange, Predicate, StringConstraint
from ibe_pubsub.credentials.schema import Attribute, Schema


class OutsidePolicy(CredentialsError, ValueError):
    """No credential inside the policy can serve the request on ``attribute``.

    ``clause`` is the policy's canonical clause text on that attribute, ``reason``
    a sentence saying why (for a 403).
    """

    def __init__(self, attribute: str, clause: str, reason: str) -> None:
        self.attribute = attribute
        self.clause = clause
        self.reason = reason
        super().__init__(f"{reason} (policy: {clause})")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        """Pickled with its own arguments, so it crosses a process pool."""
        return type(self), (self.attribute, self.clause, self.reason)


def clause_text(name: str, constraint: Constraint) -> str:
    return " and ".join(constraint.clauses(name))


def inner_cells(attr: Attribute, constraint: NumericRange | None) -> tuple[int, int] | None:
    """The cells of ``attr`` lying entirely inside ``constraint`` (None: not one cell)."""
    if constraint is None:
        return 0, attr.cells - 1
    c = constraint
    return numeric.inner_interval(attr, c.lo, c.hi, c.lo_open, c.hi_open)


def _exact_text(attr: Attribute, text: str, room: int) -> bool:
    """True iff credentials see ``text`` unchanged: at most ``room`` characters, none folded."""
    return len(text) <= room and (attr.alphabet is None
                                  or all(ch in attr.alphabet for ch in text))


def _string_within(attr: Attribute, cred: Credential, c: StringConstraint) -> bool:
    max_length = attr.max_length
    assert max_length is not None
    if c.equals is not None:
        # a terminal of max_length characters also encloses every longer value
        return cred.terminal and cred.path == c.equals and \
            _exact_text(attr, c.equals, max_length - 1)
    prefix = c.prefix
    assert prefix is not None
    return cred.path.startswith(prefix) and _exact_text(attr, prefix, max_length)


def credential_within(attr: Attribute, cred: Credential, constraint: Constraint | None) -> bool:
    """True iff every value ``cred`` encloses satisfies ``constraint`` (None: everything)."""
    if cred.attribute != attr.name or cred.kind != attr.kind:
        return False
    if constraint is None:
        return True
    if isinstance(constraint, StringConstraint):
        return not attr.is_numeric and _string_within(attr, cred, constraint)
    if not attr.is_numeric:
        return False
    cells = inner_cells(attr, constraint)
    first, last = numeric.path_cells(cred.path, attr.bits)  # type: ignore[arg-type]
    return cells is not None and cells[0] <= first and last <= cells[1]


def first_outside(schema: Schema, credentials: Iterable[Credential],
                  policy: Predicate | None) -> Credential | None:
    """The first credential whose region leaves ``policy`` (None: all inside, or no policy)."""
    if policy is None:
        return None
    for cred in credentials:
        if not credential_within(schema.attribute(cred.attribute), cred,
                                 policy.get(cred.attribute)):
            return cred
    return None


def numeric_within(attr: Attribute, request: NumericRange | None, policy: NumericRange,
                   max_credentials: int | None) -> tuple[Credential, ...]:
    """The cover of ``request`` cut to the policy's inner cells, in at most ``max_credentials``
    blocks or the fewest inside (OutsidePolicy if no cell is left)."""
    clause = clause_text(attr.name, policy)
    cells = inner_cells(attr, policy)
    if cells is None:
        raise OutsidePolicy(attr.name, clause,
                            f"no quantization cell of {attr.name!r} lies entirely inside "
                            f"the policy (cells are {(attr.max - attr.min) / attr.cells:g} "  # type: ignore[operator]
                            "wide)")
    r = request or NumericRange()
    try:
        return numeric.range_credentials(attr, r.lo, r.hi, r.lo_open, r.hi_open,
                                         max_credentials, within=cells)
    except numeric.OutsideCells as exc:
        if exc.needed is None:
            raise OutsidePolicy(attr.name, clause, f"every cell of {attr.name!r} that the "
                                "request touches straddles a bound of the policy") from exc
        fewest = exc.needed
    # The cap asks for blocks coarser than the policy's region holds (a subscription equal
    # to its policy, say): the cap only trades virtual peers for false positives, so it
    # gives way to the fewest blocks that stay inside, rather than refusing the request.
    return numeric.range_credentials(attr, r.lo, r.hi, r.lo_open, r.hi_open, fewest,
                                     within=cells)


def string_within(attr: Attribute, cred: Credential, policy: StringConstraint) -> Credential:
    """``cred`` itself if it lies inside the policy, else OutsidePolicy (no narrower one exists)."""
    if _string_within(attr, cred, policy):
        return cred
    folded = ", characters outside its alphabet fold into one" if attr.alphabet else ""
    raise OutsidePolicy(attr.name, clause_text(attr.name, policy),
                        f"credential {cred} also encloses values outside the policy "
                        f"(credentials see at most {attr.max_length} characters of "
                        f"{attr.name!r}{folded})")
