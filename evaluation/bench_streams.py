"""`bench streams`: events per second per core of a stream's publisher and subscriber, in
four scenarios on the stock schema, each against its floor.

Scenarios (a 1 s reuse window unless said otherwise):
- ``fresh``: no reuse (at most one event per header): every event pays in full;
- ``reused``: the same values every event: the whole header is reused;
- ``ticks``: the symbol fixed, the price a random walk of cent steps from 150.00 (16 price
  bits: a cell is 1.5 cents wide, so most steps move it), the volume a random trade size
  of 100 to 2,000 shares (20 bits: a new cell almost every event);
- ``ticks8``: the same feed on the stock schema with 8 price bits and 8 volume bits (cells
  of 3.91 dollars and 3,906 shares, which the walk and the trade sizes seldom leave).

Rates are per core, from the CPU time of this process (``time.process_time``), so other
work on a shared machine does not lower them. The publisher encrypts and signs; the
subscriber decodes, decrypts and verifies, as a peer does with bytes off the wire. Each
side's session certificate (issued, then verified once) is paid before timing starts.

The floor of a side is what its public-key operations cost at prices measured in the same
run: the group counts its operations (evaluation.bench_crypto), plus one Ed25519 signature or
verification per event; the ratio ``floor rate / measured rate`` is the price of the rest
(Python, hashing, the AEAD, the encoding).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import (
    PairingGroup,
    Schema,
    codec,
    decompose,
    default_schema,
    parse_predicate,
)
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import streams as T
from ibe_pubsub.evaluation.bench_crypto import RawOps, batch_time
from ibe_pubsub.evaluation.plotting import pyplot

SCENARIOS = ("fresh", "reused", "ticks", "ticks8")
EPOCH = 1
SYMBOL = "ACME"
SUBSCRIPTION = f'symbol = "{SYMBOL}" and price in [100, 200]'
#: The per-event goals of the issue this benchmark answers (events/s per core).
GOALS = {"reused": 3000, "ticks8": 1000}
CLOCK = time.process_time


def ticks8_schema() -> Schema:
    """The stock schema with 8 price bits and 8 volume bits."""
    doc = default_schema().to_dict()
    for a in doc["attributes"]:
        if a["name"] in ("price", "volume"):
            a["bits"] = 8
    return Schema.from_dict({**doc, "name": f"{doc['name']}-8bit"})


def feed(scenario: str, rng: random.Random) -> Iterator[dict[str, Any]]:
    """The values of the scenario's events, one dict an event."""
    cents = 15000
    while True:
        if scenario != "reused":
            cents += rng.choice((-1, 1))
        yield {"symbol": SYMBOL, "price": cents / 100,
               "volume": 1000 if scenario == "reused" else rng.randint(100, 2000)}


def _ed25519_prices(clock: Callable[[], float]) -> dict[str, float]:
    sk = Ed25519PrivateKey.generate()
    vk, message = sk.public_key(), bytes(32)
    signature = sk.sign(message)
    return {"ed25519_sign": batch_time(lambda: sk.sign(message), 0.1, clock=clock),
            "ed25519_verify": batch_time(lambda: vk.verify(signature, message), 0.1,
                                         clock=clock)}


class Side:
    """One side's run: CPU seconds, events, and the operations the group counted."""

    def __init__(self, group: PairingGroup, extra: str) -> None:
        self.group, self.extra = group, extra
        self.seconds, self.events, self.ops = 0.0, 0, Counter[str]()

    def run(self, fn: Callable[[], object]) -> None:
        before = Counter(self.group.counts)
        start = CLOCK()
        fn()
        self.seconds += CLOCK() - start
        self.events += 1
        self.ops += Counter(self.group.counts) - before
        self.ops[self.extra] += 1

    def report(self, prefix: str, raw_ops: RawOps, ed: dict[str, float]) -> dict[str, Any]:
        prices: dict[str, float] = {}
        for _ in range(3):
            raw_ops.sample([op for op in self.ops if op not in ed], prices)
        floor = sum(n * (ed[op] if op in ed else raw_ops.cost(op, prices))
                    for op, n in self.ops.items()) / self.events
        per_event = self.seconds / self.events
        return {f"{prefix}_events_per_s": 1 / per_event,
                f"{prefix}_floor_events_per_s": 1 / floor,
                f"{prefix}_ratio_to_floor": per_event / floor,
                f"{prefix}_ms_per_event": per_event * 1e3,
                f"{prefix}_ops_per_event": {op: n / self.events
                                            for op, n in sorted(self.ops.items())}}


def run_scenario(group: PairingGroup, scenario: str, seconds: float, raw_ops: RawOps,
                 ed: dict[str, float], rng: random.Random) -> dict[str, Any]:
    """Publish for ``seconds`` of CPU time, then have a subscriber take every event."""
    schema = ticks8_schema() if scenario == "ticks8" else default_schema()
    mpk, msk = S.setup(group)
    pp = S.PublicParams(group, mpk, schema)
    everything = decompose(schema, parse_predicate(schema, ""))
    keys = [S.keygen_publisher(pp, msk, c, EPOCH) for cs in everything.values() for c in cs]
    wanted = decompose(schema, parse_predicate(schema, SUBSCRIPTION))
    key = S.prepare_subscriber_key(pp, S.keygen_subscriber(
        pp, msk, EPOCH, [c for cs in wanted.values() for c in cs]))
    window = T.StreamWindow(1.0, 1 if scenario == "fresh" else None)
    stream = T.Stream(pp, keys, window, int(time.time()) + 3600)
    values = feed(scenario, rng)
    caches = T.StreamCaches()
    warm = T.stream_encrypt_and_sign(stream, S.Event("warm", next(values)))
    T.stream_decrypt(pp, key, caches, warm, time.time())  # issue and verify the certificate
    publisher, subscriber = Side(group, "ed25519_sign"), Side(group, "ed25519_verify")
    sent: list[bytes] = []
    while publisher.seconds < seconds or publisher.events < 20:
        event = S.Event(f"ev-{publisher.events}", next(values), b"x" * 32)
        publisher.run(lambda e=event: sent.append(
            codec.encode_stream_event(T.stream_encrypt_and_sign(stream, e))))

    def take(data: bytes) -> None:
        ct = codec.decode_stream_event(group, data)
        T.stream_decrypt(pp, key, caches, ct, time.time())
        if not T.stream_verify(pp, caches, ct, time.time()):
            raise AssertionError("a stream event failed verification in the benchmark")

    for data in sent:
        subscriber.run(lambda d=data: take(d))
    return {**publisher.report("publisher", raw_ops, ed),
            **subscriber.report("subscriber", raw_ops, ed), "events": len(sent),
            "event_bytes": sum(map(len, sent)) / len(sent)}


def run(group: PairingGroup, seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    raw_ops = RawOps(group, min(0.05, seconds / 20), clock=CLOCK)
    ed = _ed25519_prices(CLOCK)
    rng = random.Random(2026)
    scenarios = {}
    for name in SCENARIOS:
        progress(f"scenario {name}")
        scenarios[name] = run_scenario(group, name, seconds, raw_ops, ed, rng)
    return {"scenarios": scenarios}


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = report["scenarios"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.2
    for k, (side, measured) in enumerate((("publisher", True), ("publisher", False),
                                          ("subscriber", True), ("subscriber", False))):
        field = f"{side}_events_per_s" if measured else f"{side}_floor_events_per_s"
        ax.bar([i + (k - 1.5) * width for i in range(len(rows))],
               [r[field] for r in rows.values()], width,
               label=f"{side}{'' if measured else ' floor'}", color=f"C{k // 2}",
               alpha=1.0 if measured else 0.4)
    for name, goal in GOALS.items():
        i = list(rows).index(name)
        ax.hlines(goal, i - 0.45, i + 0.45, color="tab:red", linestyles="--")
    ax.set_xticks(range(len(rows)), list(rows))
    ax.set(yscale="log", ylabel="events/s per core (CPU time)",
           title="Streams on the stock schema: measured and floor (red: goals)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run_streams_bench(json_path: Path, seconds: float, backend: str | None) -> dict[str, Any]:
    from ibe_pubsub.credentials import load_group

    report = run(load_group(backend), seconds,
                 lambda msg: print(f"[bench streams] {msg}", file=sys.stderr, flush=True))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2))
    plot(report, json_path.with_suffix(".png"))
    return report
