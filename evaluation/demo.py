"""``ibe-pubsub demo``: a whole overlay on loopback, checked against the plain predicates.

Everything runs as real processes on embedded defaults: a key server on a
temporary SQLite data directory, one root peer per attribute, subscriber peers
with varied subscriptions (numeric ranges and string prefixes over the stock
quote schema), and one publisher. Peer links are mutually authenticated TLS with
certificates from the key server (plaintext only with ``insecure_transport``).
Ground truth is computed from the plaintext predicates; the demo fails if any
subscriber missed an event or got one it should not have.
"""

from __future__ import annotations

import random
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import Event, default_schema, parse_predicate
from ibe_pubsub.evaluation.cluster import Cluster, ClusterError
from ibe_pubsub.evaluation.exceptions import BenchRunError, EvaluationError
from ibe_pubsub.evaluation.launcher import (
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.tree_plot import draw_trees

SYMBOLS = ("AAPL", "AMZN", "GOOG", "GOOGL", "IBM", "INTC", "META", "MSFT", "NVDA", "ORCL")
#: Subscription templates; later subscribers get shifted numeric ranges.
TEMPLATES = (
    'price in [{lo}, {hi}]',
    'symbol prefix "GO"',
    'symbol prefix "M" and price >= {lo}',
    'volume >= {vol}',
    'symbol = "IBM" and volume < {vol}',
    'price < {lo} and volume >= {vol2}',
    'symbol prefix "A" and price in [{lo}, {hi}]',
    'price >= {hi}',
    'symbol prefix "IN"',
    'volume in [{vol2}, {vol}] and price < {hi}',
)


class DemoError(EvaluationError, RuntimeError):
    """The demo could not set itself up (not: a delivery mismatch, which is a result)."""


def progress(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def subscriptions(count: int, rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for i in range(count):
        lo = rng.randrange(50, 500, 10)
        hi = lo + rng.randrange(100, 450, 10)
        vol = rng.randrange(300_000, 900_000, 10_000)
        text = TEMPLATES[i % len(TEMPLATES)].format(lo=lo, hi=hi, vol=vol, vol2=vol // 3)
        out.append((f"sub{i + 1:02d}", text))
    return out


def quotes(count: int, rng: random.Random) -> list[Event]:
    return [Event(f"q{i + 1:04d}", {"symbol": rng.choice(SYMBOLS),
                                    "price": round(rng.uniform(0, 1000), 2),
                                    "volume": rng.randrange(0, 1_000_001)},
                  f"quote {i + 1}".encode()) for i in range(count)]


def ground_truth(subs: list[tuple[str, str]], events: list[Event]) -> dict[str, set[str]]:
    schema = default_schema()
    return {name: {e.event_id for e in events if parse_predicate(schema, text).matches(e.values)}
            for name, text in subs}


def compare(cluster: Cluster, expected: dict[str, set[str]], sent: dict[str, float]
            ) -> list[dict[str, Any]]:
    """One row per subscriber: delivered vs expected, duplicates, delay, false positives."""
    rows = []
    for name, want in expected.items():
        peer = cluster.peers[name]
        lines = peer.delivered()
        ids = [d["id"] for d in lines]
        delays = [d["delivered_at"] - sent[d["id"]] for d in lines if d["id"] in sent]
        stats = peer.stats()
        rows.append({
            "name": name, "subscription": peer.subscription, "delivered": len(set(ids)),
            "expected": len(want), "missed": sorted(want - set(ids)),
            "unexpected": sorted(set(ids) - want), "duplicates": len(ids) - len(set(ids)),
            "false_positives": stats.get("false_positives"),
            "mean_delay_ms": round(1000 * sum(delays) / len(delays), 1) if delays else None,
            "delivered_ids": ids})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'subscriber':<10} {'delivered':>9} {'expected':>8} {'false+':>6} " \
           f"{'delay ms':>8}  {'result':<6}  subscription"
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = not (r["missed"] or r["unexpected"] or r["duplicates"])
        fp = "-" if r["false_positives"] is None else r["false_positives"]
        delay = "-" if r["mean_delay_ms"] is None else f"{r['mean_delay_ms']:.1f}"
        lines.append(f"{r['name']:<10} {r['delivered']:>9} {r['expected']:>8} {fp:>6} "
                     f"{delay:>8}  {'ok' if ok else 'WRONG':<6}  {r['subscription']}")
    return "\n".join(lines)


def run_demo(peers: int = 8, routing: str = "ohf", events: int = 60, seed: int = 7,
             workdir: str | None = None, max_children: int = 3,
             insecure_transport: bool = False, graph: str | None = None) -> dict[str, Any]:
    """Run the whole demo; returns the report (``ok`` says whether every delivery matched).
    With ``graph``, every peer serves --http and the trees they report at the end are drawn
    there."""
    with tempfile.TemporaryDirectory(prefix="ibe-pubsub-demo-") as tmp:
        root = Path(workdir) if workdir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        return _run(root, peers, routing, events, seed, max_children, insecure_transport,
                    graph)


def _run(root: Path, peers: int, routing: str, count: int, seed: int, max_children: int,
         insecure_transport: bool, graph: str | None) -> dict[str, Any]:
    rng = random.Random(seed)
    started = time.monotonic()
    passphrase = secrets.token_urlsafe(24)
    data = root / "keyserver"
    progress(f"key server: creating master keys in {data}")
    try:
        init_keyserver(data, passphrase)
    except BenchRunError as exc:
        raise DemoError(str(exc)) from exc
    url = f"http://127.0.0.1:{free_port()}"
    server = start_keyserver(data, int(url.rsplit(":", 1)[1]), passphrase,
                             log=root / "keyserver.log")
    cluster: Cluster | None = None
    try:
        wait_ready(url, server)
        progress(f"key server ready at {url}")
        cluster = Cluster(url, (data / "admin.token").read_text().strip(), root / "peers",
                          routing=routing, max_children=max_children,
                          insecure_transport=insecure_transport,
                          peer_args=("--http", "0") if graph else ())
        schema = default_schema()
        roots = [cluster.start_root(f"root-{a}", [a]) for a in schema.names]
        cluster.wait_ready(roots)
        links = "plaintext" if insecure_transport else "mutual TLS"
        progress(f"{len(roots)} root peers ready ({routing} routing, {links} peer links)")
        subs = subscriptions(peers, rng)
        procs = [cluster.start_subscriber(name, text) for name, text in subs]
        cluster.wait_ready(procs, timeout=90)
        progress(f"{len(procs)} subscribers joined after {time.monotonic() - started:.1f} s")
        stream = quotes(count, rng)
        expected = ground_truth(subs, stream)
        result = cluster.publish("publisher", stream, interval=0.02)
        if result.returncode != 0:
            raise DemoError(f"publisher failed: {result.stderr.strip()}")
        progress(f"published {count} events; waiting for deliveries")
        cluster.wait_deliveries(expected, timeout=30)
        if graph:
            draw_trees(cluster.statuses(), graph, f"Trees of the demo: {peers} subscribers, "
                       f"{routing} routing, out-degree {max_children}")
            progress(f"drew the trees in {graph}")
        cluster.stop_all()
        rows = compare(cluster, expected, cluster.sent_times("publisher"))
    except (ClusterError, BenchRunError) as exc:  # its key server or a peer failed
        raise DemoError(str(exc)) from exc
    finally:
        if cluster is not None:
            cluster.stop_all()
        stop(server)
    print(table(rows))
    ok = all(not (r["missed"] or r["unexpected"] or r["duplicates"]) for r in rows)
    elapsed = time.monotonic() - started
    delays = [r["mean_delay_ms"] for r in rows if r["mean_delay_ms"] is not None]
    summary = {"subscribers": len(rows), "events": count, "routing": routing,
               "deliveries": sum(r["delivered"] for r in rows),
               "expected": sum(r["expected"] for r in rows),
               "false_positives": sum(r["false_positives"] or 0 for r in rows),
               "mean_delay_ms": round(sum(delays) / len(delays), 1) if delays else None,
               "transport": "plaintext" if insecure_transport else "mutual TLS",
               "seconds": round(elapsed, 1)}
    delay = "no deliveries to time" if not delays else f"mean delay {summary['mean_delay_ms']} ms"
    print(f"\n{'OK' if ok else 'FAILED'}: {summary['deliveries']} of {summary['expected']} "
          f"expected deliveries to {len(rows)} subscribers, "
          f"{summary['false_positives']} false positives filtered, "
          f"{delay}, {summary['seconds']} s in total")
    return {
        "ok": ok,
        "subscribers": [{"name": r["name"], "subscription": r["subscription"]} for r in rows],
        "events": [{"id": e.event_id, "values": e.values} for e in stream],
        "deliveries": {r["name"]: r["delivered_ids"] for r in rows},
        "stats": {"summary": summary, "per_subscriber": [
            {k: v for k, v in r.items() if k not in ("delivered_ids",)} for r in rows]},
    }
