"""A seeded stock-quote workload for the evaluation: subscriptions and events.

Subscriptions are drawn from a finite vocabulary (ten ticker symbols, price
windows on a 50-unit grid, four volume floors) the way real subscribers pick
round numbers, so equal subscriptions recur and group-key schemes can share keys.
Everything is a function of the seed, so every scheme sees the same workload; the
events do not depend on the number of subscribers, and the first n subscriptions
are the same for every larger population.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ibe_pubsub.credentials import Predicate, Schema, default_schema, parse_predicate

SYMBOLS = ("AAPL", "AMZN", "GOOG", "IBM", "INTC", "MSFT", "NVDA", "ORCL", "SAP", "TSLA")
PRICE_STEP = 50
PRICE_WIDTHS = (50, 100, 200)
VOLUME_FLOORS = (0, 1_000, 10_000, 100_000)


@dataclass(frozen=True)
class Workload:
    """Subscriptions (one per subscriber) and event values, on one schema."""

    schema: Schema
    subscriptions: tuple[Predicate, ...]
    events: tuple[dict[str, Any], ...]

    def interested(self, values: dict[str, Any]) -> list[int]:
        """Indices of the subscribers whose subscription matches the event."""
        return [i for i, p in enumerate(self.subscriptions) if p.matches(values)]


def subscription_text(rng: random.Random) -> str:
    """One subscription: usually a symbol, always a price window, sometimes a volume floor."""
    clauses = []
    if rng.random() < 0.7:
        clauses.append(f'symbol = "{rng.choice(SYMBOLS)}"')
    low = PRICE_STEP * rng.randrange(1000 // PRICE_STEP)
    clauses.append(f"price in [{low}, {min(low + rng.choice(PRICE_WIDTHS), 1000)}]")
    floor = rng.choice(VOLUME_FLOORS)
    if floor:
        clauses.append(f"volume >= {floor}")
    return " and ".join(clauses)


def event_values(rng: random.Random) -> dict[str, Any]:
    """A quote: uniform symbol and price, log-uniform volume."""
    return {"symbol": rng.choice(SYMBOLS), "price": round(rng.uniform(0, 1000), 2),
            "volume": min(int(10 ** rng.uniform(1, 6)), 1_000_000)}


def make_workload(subscribers: int, events: int, seed: int) -> Workload:
    schema = default_schema()
    sub_rng, event_rng = random.Random(seed), random.Random(seed + 1)
    subs = tuple(parse_predicate(schema, subscription_text(sub_rng))
                 for _ in range(subscribers))
    return Workload(schema, subs, tuple(event_values(event_rng) for _ in range(events)))
