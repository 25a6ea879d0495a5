"""Seeded random subscriptions and events over any schema, for simulations and tests.

Numeric subscriptions are ranges whose width is a log-uniform fraction of the
domain (between ``1/64`` and ``1/2``); string subscriptions are an equality or a
one-character prefix over a small pool of values that events also draw from, so
subscriptions and events overlap the way a stock feed's do.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Sequence
from typing import Any

from ibe_pubsub.credentials import Attribute, Predicate, Schema, parse_predicate, quote


class Workload:
    def __init__(self, schema: Schema, rng: random.Random, pool_size: int = 16) -> None:
        self.schema = schema
        self.rng = rng
        self.pool = {a.name: self._pool(a, pool_size) for a in schema.attributes
                     if not a.is_numeric}

    def _pool(self, a: Attribute, n: int) -> list[str]:
        length = min(3, a.max_length or 3)
        letters = (a.alphabet or string.ascii_uppercase)[:6]
        return sorted({"".join(self.rng.choice(letters) for _ in range(length))
                       for _ in range(n)})

    def _clause(self, a: Attribute) -> str:
        rng = self.rng
        if not a.is_numeric:
            value = rng.choice(self.pool[a.name])
            if rng.random() < 0.5:
                return f"{a.name} = {quote(value)}"
            return f"{a.name} prefix {quote(value[0])}"
        lo_d, hi_d = float(a.min), float(a.max)  # type: ignore[arg-type]
        width = (hi_d - lo_d) * math.exp(rng.uniform(math.log(1 / 64), math.log(1 / 2)))
        lo = rng.uniform(lo_d, hi_d - width)
        if a.type == "int":
            return f"{a.name} in [{int(lo)}, {int(lo + width)}]"
        return f"{a.name} in [{lo:.3f}, {lo + width:.3f}]"

    def predicate(self, attributes: Sequence[str] | None = None) -> Predicate:
        """A subscription constraining ``attributes`` (default: one or two at random)."""
        names = list(attributes) if attributes is not None else self.rng.sample(
            list(self.schema.names), k=self.rng.choice((1, 2)))
        text = " and ".join(self._clause(self.schema.attribute(n)) for n in names)
        return parse_predicate(self.schema, text)

    def values(self) -> dict[str, Any]:
        """An event: a value for every attribute."""
        out: dict[str, Any] = {}
        for a in self.schema.attributes:
            if not a.is_numeric:
                out[a.name] = self.rng.choice(self.pool[a.name])
            elif a.type == "int":
                out[a.name] = self.rng.randint(int(a.min), int(a.max))  # type: ignore[arg-type]
            else:
                out[a.name] = self.rng.uniform(float(a.min), float(a.max))  # type: ignore[arg-type]
        return out
