"""`bench exactness`: does every subscriber get exactly the events it should, on every seed?

Each run builds an overlay in the simulator (plaintext crypto: the question is the
protocol, not its costs), lets it settle, publishes a stream of events and, with churn,
has subscribers leave gracefully, crash and join while the events flow. Link delays are
deliberately uneven (log-normal, sigma 1.5, capped at 1 s), which is what exposes races
between a link change and an event in flight.

*Expected* deliveries: event ``e`` published at ``t`` is expected at subscriber ``s`` iff
``s``'s subscription matches it and ``s`` was rooted (every one of its virtual peers
linked, through live peers holding the links, to its tree's root; see
:func:`overlay.checks.rooted_subscribers`) at every sample from ``t - grace`` to
``t + grace``, and no peer above it crashed within ``grace`` of ``t``. So a subscriber
is owed nothing published before its join completed plus the grace, after it left or
crashed minus the grace, or around a crash above it (which cuts it off until it has
rejoined). A graceful leave above it excuses nothing: the leaving peer hands its
children over and serves them until they have linked elsewhere (make before break), so
a subscriber below it counts as rooted from the leave until ``Timing.handover`` after it,
even while it rejoins. Without churn every subscriber is rooted once its join is done,
so every matching pair published after the joins is expected. A run is exact when no
expected pair is missing and nobody got an event its subscription does not match.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any

from ibe_pubsub.credentials import Schema, default_schema
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.evaluation.sizes import EXACTNESS_SCHEMAS
from ibe_pubsub.overlay import (
    LatencyModel,
    OverlayConfig,
    Routing,
    Simulator,
    rooted_subscribers,
    subscribers_below,
)

#: Uneven links (a few 25 times the median), but none slower than the failure detector.
LATENCY = LatencyModel(median=0.04, sigma=1.5, cap=1.0)


def strings_schema() -> Schema:
    """Two string attributes (prefix-trie credentials), unlike the stock schema's mix."""
    return Schema.from_dict({"name": "exactness-strings", "attributes": [
        {"name": "topic", "type": "string", "max_length": 4, "alphabet": "ABCDEF"},
        {"name": "region", "type": "string", "max_length": 3, "alphabet": "NSEW"}]})


SCHEMAS: dict[str, Callable[[], Schema]] = dict(zip(EXACTNESS_SCHEMAS,
                                                    (default_schema, strings_schema), strict=True))


@dataclass(frozen=True)
class Case:
    schema: str
    routing: Routing
    subscribers: int
    churn: bool
    seed: int


@dataclass(frozen=True)
class Timing:
    """The run's schedule (seconds) and churn. Events start soon after the last join, so
    they flow while peers are still recruited (moved by swaps, see overlay/README.md)."""

    arrival: float = 0.02
    settle: float = 2.0
    events: int = 200
    interval: float = 0.05
    drain: float = 10.0
    grace: float = 2.0
    #: How often rootedness is sampled.
    sample: float = 0.1
    #: With churn, this fraction of the subscribers leaves (half gracefully, half by a
    #: crash) and as many new ones join, at random times while the events are published.
    churn: float = 0.2
    #: For this long after a graceful leave, the subscribers below the leaving peer are
    #: owed every event (they are being handed over; see the module docstring).
    handover: float = 6.0


def run_case(case: Case, timing: Timing = Timing()) -> dict[str, Any]:
    """One run; its counts of expected, missing and extra (subscriber, event) pairs."""
    started = time.process_time()
    schema = SCHEMAS[case.schema]()
    sim = Simulator(schema, OverlayConfig(routing=case.routing), mode="plaintext",
                    seed=case.seed, latency=LATENCY)
    sim.add_roots()
    workload = Workload(schema, random.Random(case.seed))
    for i in range(case.subscribers):
        sim.add_subscriber(workload.predicate(), at=i * timing.arrival)
    start = case.subscribers * timing.arrival + timing.settle
    sim.run_until(start)
    publisher = sim.add_publisher()
    window = timing.events * timing.interval
    events = {sim.publish(publisher, values, at=start + i * timing.interval): values
              for i, values in enumerate(workload.values() for _ in range(timing.events))}
    plan = _churn_plan(sim, workload, case, timing, start, window) if case.churn else []
    samples, cut = _run_sampling(sim, plan, timing, start + window + timing.drain)
    return {**asdict(case), **_score(sim, events, samples, cut, timing.grace),
            "leaves": sum(what == "leave" for _, what, _ in plan),
            "churned": len(plan), "cpu_s": round(time.process_time() - started, 2)}


def _churn_plan(sim: Simulator, workload: Workload, case: Case, timing: Timing,
                start: float, window: float) -> list[tuple[float, str, str]]:
    """(time, 'leave' | 'crash', address) for a sample of subscribers; new subscribers are
    added to the simulator right away, joining at random times of the window."""
    rng = random.Random(case.seed * 7919 + 1)
    k = max(1, round(timing.churn * case.subscribers))
    gone = rng.sample(sim.alive_subscribers(), k)
    for _ in range(k):
        sim.add_subscriber(workload.predicate(), at=start + rng.uniform(0, window))
    return sorted((start + rng.uniform(0, window), "leave" if i % 2 else "crash", address)
                  for i, address in enumerate(gone))


Samples = list[tuple[float, set[str]]]


def _run_sampling(sim: Simulator, plan: list[tuple[float, str, str]], timing: Timing,
                  until: float) -> tuple[Samples, Samples]:
    """Run to ``until``, applying the churn plan; returns the rooted subscribers, sampled
    every ``timing.sample`` (with those below a leaving peer, see the module docstring), and, at
    each crash, the subscribers it cut off (a rejoin can be quicker than the sampling
    step)."""
    # (a first sample at the start: a newcomer joining just after the first event is not
    # owed it)
    samples, cut, pending = [(sim.now, rooted_subscribers(sim))], [], list(plan)
    handed: list[tuple[float, set[str]]] = []
    t = sim.now
    while t < until:
        t = min(until, t + timing.sample)
        while pending and pending[0][0] <= t:
            at, what, address = pending.pop(0)
            sim.run_until(at)
            below = subscribers_below(sim, address) - {address}
            if what == "leave":
                handed.append((at + timing.handover, below))
                sim.leave(address)
            else:
                cut.append((at, below))
                sim.kill(address)
        sim.run_until(t)
        alive = set(sim.alive_subscribers())  # a crash or a leave of its own ends it
        rooted = rooted_subscribers(sim).union(*(b & alive for end, b in handed if t <= end))
        samples.append((t, rooted))
    return samples, cut


def _score(sim: Simulator, events: dict[str, dict[str, Any]], samples: Samples,
           cut: Samples, grace: float) -> dict[str, Any]:
    expected = missing = extra = excused = 0
    examples: list[str] = []
    for event_id, values in events.items():
        at = sim.metrics.published[event_id]
        window = [rooted for t, rooted in samples if at - grace <= t <= at + grace]
        owed = set.intersection(*window) if window else set()
        owed -= {a for t, below in cut if abs(t - at) <= grace for a in below}
        matching = {a for a, p in sim.predicates.items() if p.matches(values)}
        got = set(sim.metrics.deliveries.get(event_id, {}))
        lost = (matching & owed) - got
        expected += len(matching & owed)
        missing += len(lost)
        extra += len(got - matching)
        excused += len(matching - owed)
        examples += [f"{event_id} at {at:.2f} s: {a} missed it" for a in sorted(lost)]
    return {"expected": expected, "missing": missing, "extra": extra,
            "not_owed": excused, "examples": examples[:5]}


def cases(schemas: Iterable[str], routings: Iterable[Routing], sizes: Iterable[int],
          churn: Iterable[bool], seeds: Iterable[int]) -> list[Case]:
    return [Case(s, r, n, c, seed) for s in schemas for r in routings for n in sizes
            for c in churn for seed in seeds]


def summarize(runs: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    return {"runs": len(runs), "runs_with_misses": sum(r["missing"] > 0 for r in runs),
            "runs_with_extras": sum(r["extra"] > 0 for r in runs),
            "expected": sum(r["expected"] for r in runs),
            "missing": sum(r["missing"] for r in runs),
            "extra": sum(r["extra"] for r in runs),
            "not_owed": sum(r["not_owed"] for r in runs),
            "not_owed_without_churn": sum(r["not_owed"] for r in runs if not r["churn"]),
            "cpu_s": round(sum(r["cpu_s"] for r in runs), 1), "wall_s": round(wall_s, 1)}


def run(todo: list[Case], timing: Timing, workers: int,
        progress: Callable[[str], None]) -> dict[str, Any]:
    """Every case, ``workers`` at a time, reporting each as it ends."""
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    try:
        for done, r in enumerate(_results(todo, timing, pool), 1):
            runs.append(r)
            verdict = "exact" if not (r["missing"] or r["extra"]) else (
                f"{r['missing']} MISSED, {r['extra']} extra: {'; '.join(r['examples'])}")
            progress(f"{done}/{len(todo)} {r['schema']} {r['routing']} n={r['subscribers']} "
                     f"{'churn' if r['churn'] else 'steady'} seed={r['seed']}: "
                     f"{r['expected']} expected, {verdict} "
                     f"({time.monotonic() - started:.0f} s)")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    runs.sort(key=lambda r: (r["schema"], r["routing"], r["subscribers"], r["churn"],
                             r["seed"]))
    return {"experiment": "exact delivery", "timing": asdict(timing),
            "latency_model": asdict(LATENCY),
            "summary": summarize(runs, time.monotonic() - started), "runs": runs}


def _results(todo: list[Case], timing: Timing, pool: ProcessPoolExecutor | None
             ) -> Iterator[dict[str, Any]]:
    """Each case's result as soon as it is done."""
    if pool is None:
        yield from (run_case(c, timing) for c in todo)
        return
    yield from (f.result() for f in as_completed([pool.submit(run_case, c, timing)
                                                  for c in todo]))
