"""Random enrolment requests for a schema: benchmark input and test data.

Nearly all are valid; a strict bound at a domain end selects nothing and is rejected,
as it should be.
"""

from __future__ import annotations

import random
import string

import pyarrow as pa

from ibe_pubsub.credentials import Attribute, Schema, quote


def _number(attr: Attribute, rng: random.Random) -> str:
    if attr.type == "int":
        return str(rng.randint(int(attr.min), int(attr.max)))  # type: ignore[arg-type]
    return f"{rng.uniform(attr.min, attr.max):.2f}"  # type: ignore[arg-type]


def _clause(attr: Attribute, rng: random.Random) -> str:
    if not attr.is_numeric:
        alphabet = attr.alphabet or string.ascii_uppercase
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, attr.max_length or 4)))
        return f"{attr.name} {rng.choice(['=', 'prefix'])} {quote(text)}"
    form = rng.choice(["in", ">=", "<=", ">", "<", "="])
    if form == "in":
        a, b = _number(attr, rng), _number(attr, rng)
        lo, hi = sorted((a, b), key=float)
        return f"{attr.name} in [{lo}, {hi}]"
    return f"{attr.name} {form} {_number(attr, rng)}"


def random_predicate(schema: Schema, rng: random.Random) -> str:
    """A conjunction constraining a random subset of the attributes (maybe none)."""
    return " and ".join(_clause(a, rng) for a in schema.attributes if rng.random() < 0.7)


def random_requests(schema: Schema, count: int, seed: int = 0,
                    prefix: str = "user-") -> pa.Table:
    """``count`` requests with unique identities, about 80% subscribers."""
    rng = random.Random(seed)
    roles = ["subscriber" if rng.random() < 0.8 else "publisher" for _ in range(count)]
    return pa.table({
        "identity": [f"{prefix}{i:07d}" for i in range(count)],
        "role": roles,
        "predicate": [random_predicate(schema, rng) for _ in range(count)],
    })
