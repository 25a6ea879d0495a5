"""`bench crypto`: the backend's raw operations and every algorithm against its floor.

The floor of an algorithm is what its raw group operations cost at the prices
measured in the same run: the group counts each operation it performs, so the
floor is ``sum(count_op * cost_op)`` and the ratio ``measured / floor`` is the
price of everything that is not pairing arithmetic (Python, hashing, AEAD).
A multi-pairing of n pairs is priced as n Miller loops and one final
exponentiation, its native cost. ``route`` and ``open_request`` are what a peer does
with bytes off the wire: decode (the one element it uses is checked then) and test.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import G2, Credential, PairingGroup, Schema, codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.evaluation.plotting import pyplot
from ibe_pubsub.evaluation.threshold_lab import local_deployment

BATCHES = 5
ALGORITHMS = ("keygen_publisher", "keygen_subscriber", "encrypt_and_sign", "route_test",
              "route", "decrypt", "verify", "build_connection_request",
              "open_connection_request", "open_request", "keyshare_subscriber",
              "verify_subscriber_share", "combine_subscriber_key")
#: The threshold deployment the version-3 algorithms run in (docs/scheme.md, section 16).
THRESHOLD_T, THRESHOLD_N = 3, 5


def batch_time(fn: Callable[[], object], seconds: float, min_calls: int = 2,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call (on ``clock``) over one batch lasting at least ``seconds``."""
    calls, start = 0, clock()
    while calls < min_calls or clock() - start < seconds:
        fn()
        calls += 1
    return (clock() - start) / calls


def time_per_call(fn: Callable[[], object], min_seconds: float) -> float:
    """The best of BATCHES batches: the minimum is robust to bursts of load."""
    fn()
    return min(batch_time(fn, min_seconds / BATCHES) for _ in range(BATCHES))


class RawOps:
    """Prices of raw operations, under the names the group counts them by.

    An algorithm's floor is priced from samples taken interleaved with its own
    batches (the minimum of each side over the same rounds), so a machine whose
    speed drifts (shared cores, frequency scaling) affects both sides alike.
    Miller loops and the final exponentiation are derived from multi-pairings
    of 1 and N_PAIRS + 1 pairs; multi-exponentiations are priced per size.
    """

    N_PAIRS = 8

    def __init__(self, group: PairingGroup, batch_seconds: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.group, self.batch_seconds, self.clock = group, batch_seconds, clock
        P = group.hash_to_g1(b"bench", S.DST_ID)
        Q = group.generator(G2) ** group.random_scalar()
        Qp, e = group.prepare(Q), group.pair(P, Q)
        k, short, n = group.random_scalar(), random.getrandbits(64) | 1, self.N_PAIRS + 1
        self.P, self.Q, self.k = P, Q, k
        self._fns: dict[str, Callable[[], object]] = {
            "pairs_1": lambda: group.multi_pair([(P, Q)]),
            "pairs_n": lambda: group.multi_pair([(P, Q)] * n),
            "prepared_1": lambda: group.multi_pair([(P, Qp)]),
            "prepared_n": lambda: group.multi_pair([(P, Qp)] * n),
            "hash_G1": lambda: group.hash_to_g1(b"some identity string", S.DST_ID),
        }
        for name, base in (("G1", P), ("G2", Q), ("GT", e)):
            self._fns[f"exp_{name}"] = lambda b=base: b ** k
            self._fns[f"exp_{name}_short"] = lambda b=base: b ** short
        for name, base in (("G1", P), ("G2", Q)):
            self._fns[f"exp_{name}_ct"] = lambda b=base: group.exp_secret(b, k)
        self.best: dict[str, float] = {}

    @staticmethod
    def samples_for(op: str) -> tuple[str, ...]:
        if op in ("miller_loop", "final_exp"):
            return ("pairs_1", "pairs_n")
        if op == "miller_loop_prepared":
            return ("prepared_1", "prepared_n")
        return (op,)

    def _fn(self, name: str) -> Callable[[], object]:
        if name not in self._fns and name.startswith("multi_exp_"):
            kind, size = name.removeprefix("multi_exp_").split("_")
            base, n = (self.P if kind == "G1" else self.Q), int(size)
            self._fns[name] = lambda: self.group.multi_exp([base] * n, [self.k] * n)
        return self._fns[name]

    def sample(self, ops: Iterable[str], best: dict[str, float]) -> None:
        """One more batch of each raw operation ``ops`` are priced from, kept if faster."""
        for name in {s for op in ops for s in self.samples_for(op)}:
            t = batch_time(self._fn(name), self.batch_seconds, clock=self.clock)
            best[name] = min(best.get(name, t), t)
            self.best[name] = min(self.best.get(name, t), t)

    def cost(self, op: str, best: dict[str, float]) -> float:
        if op in ("miller_loop", "final_exp"):
            miller = (best["pairs_n"] - best["pairs_1"]) / self.N_PAIRS
            return miller if op == "miller_loop" else best["pairs_1"] - miller
        if op == "miller_loop_prepared":
            return (best["prepared_n"] - best["prepared_1"]) / self.N_PAIRS
        return best[op]

    def table(self) -> dict[str, float]:
        """The best price of every operation sampled in the run, the pairing parts derived."""
        derived = [op for op in ("miller_loop", "final_exp", "miller_loop_prepared")
                   if all(s in self.best for s in self.samples_for(op))]
        direct = [name for name in self.best if not name.startswith(("pairs_", "prepared_"))]
        return {op: self.cost(op, self.best) for op in sorted(derived + direct)}


def bench_schema(d: int, bits: int) -> Schema:
    return Schema.from_dict({"name": f"bench-{d}x{bits}", "attributes": [
        {"name": f"a{i}", "type": "int", "min": 0, "max": 2 ** bits - 1, "bits": bits}
        for i in range(d)]})


def _algorithm_runs(group: PairingGroup, schema: Schema, rng: random.Random,
                    threshold: tuple[T.ThresholdPublicKey, dict[int, T.ServerSecrets]]
                    ) -> dict[str, Callable[[], object]]:
    """One closure per algorithm on a random event and a subscriber that matches it."""
    epoch = 1
    mpk, msk = S.setup(group)
    pp = S.PublicParams(group, mpk, schema)
    attrs = schema.attributes
    values = {a.name: rng.randrange(0, 2 ** a.bits) for a in attrs}
    roots = [Credential(a.name, "num", "") for a in attrs]
    depth = {a.name: rng.randrange(1, a.bits + 1) for a in attrs}
    mine = [Credential(a.name, "num", format(values[a.name], f"0{a.bits}b")[:depth[a.name]])
            for a in attrs]
    publisher = [S.keygen_publisher(pp, msk, c, epoch) for c in roots]
    subscriber = S.prepare_subscriber_key(pp, S.keygen_subscriber(pp, msk, epoch, mine))
    event = S.Event("bench", values, b"x" * 64)
    ct = S.encrypt_and_sign(pp, publisher, event)
    server = Ed25519PrivateKey.generate()
    joiner = Credential(attrs[0].name, "num", format(values[attrs[0].name], f"0{attrs[0].bits}b"))
    request, _ = S.build_connection_request(pp, server, joiner, epoch, 2 ** 40)
    token = subscriber.credentials[0].token
    event_bytes, request_bytes = codec.encode_event(ct), codec.encode_request(request)
    tpk, secrets = threshold
    tpp = S.PublicParams(group, tpk.mpk, schema)
    shares = [T.keyshare_subscriber(tpp, tpk, secrets[i], "bench", epoch, mine)
              for i in range(1, THRESHOLD_T + 1)]
    blinded = codec.decode_blinded_token(group, codec.encode_blinded_token(token.blinded()))
    return {
        "keygen_publisher": lambda: S.keygen_publisher(pp, msk, mine[0], epoch),
        "keygen_subscriber": lambda: S.keygen_subscriber(pp, msk, epoch, mine),
        "encrypt_and_sign": lambda: S.encrypt_and_sign(pp, publisher, event),
        "route_test": lambda: S.route_test(pp, token, ct),
        "route": lambda: S.route_test(pp, blinded, codec.decode_event(group, event_bytes)),
        "decrypt": lambda: S.decrypt(pp, subscriber, ct),
        "verify": lambda: S.verify(pp, ct),
        "build_connection_request": lambda: S.build_connection_request(
            pp, server, joiner, epoch, 2 ** 40),
        "open_connection_request": lambda: S.open_connection_request(pp, token, request),
        "open_request": lambda: S.open_connection_request(
            pp, blinded, codec.decode_request(group, request_bytes)),
        # Version 3: one server's share, a client's check of one share, and combining t.
        "keyshare_subscriber": lambda: T.keyshare_subscriber(tpp, tpk, secrets[1], "bench",
                                                             epoch, mine),
        "verify_subscriber_share": lambda: T.verify_subscriber_share(tpp, tpk, shares[0],
                                                                     "bench", epoch, mine),
        "combine_subscriber_key": lambda: T.combine_subscriber_key(tpp, tpk, shares),
    }


def run(group: PairingGroup, dims: list[int], bits_list: list[int], min_seconds: float,
        progress: Callable[[str], None]) -> dict[str, Any]:
    progress(f"raw operations on {group.name}")
    raw_ops = RawOps(group, min_seconds / BATCHES)
    P, Q = raw_ops.P, raw_ops.Q
    pairing = time_per_call(lambda: group.pair(P, Q), min_seconds)
    raw = {
        "pairing_ms": pairing * 1e3,
        "multi_pairing_7_ms": time_per_call(lambda: group.multi_pair([(P, Q)] * 7),
                                            min_seconds) * 1e3,
        "seven_pairings_ms": 7 * pairing * 1e3,
    }
    results = []
    rng = random.Random(2026)
    # One deployment for every configuration: its keys do not depend on the schema.
    threshold = local_deployment(group, THRESHOLD_T, THRESHOLD_N, b"bench")
    for d in dims:
        for bits in bits_list:
            progress(f"algorithms for d={d} bits={bits}")
            for name, fn in _algorithm_runs(group, bench_schema(d, bits), rng,
                                              threshold).items():
                fn()  # warm the per-epoch caches, as a running peer has them
                group.counts.clear()
                fn()
                ops = dict(sorted(group.counts.items()))
                seconds, prices = float("inf"), {}
                for _ in range(BATCHES):
                    seconds = min(seconds, batch_time(fn, min_seconds / BATCHES))
                    raw_ops.sample(ops, prices)
                floor = sum(n * raw_ops.cost(op, prices) for op, n in ops.items())
                results.append({"algorithm": name, "d": d, "bits": bits, "ms": seconds * 1e3,
                                "floor_ms": floor * 1e3, "ratio": seconds / floor,
                                "ops_per_call": ops})
    return {"backend": group.name, "raw": raw,
            "costs_ms": {k: v * 1e3 for k, v in raw_ops.table().items()},
            "algorithms": results}


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = report["algorithms"]
    bits_list = sorted({r["bits"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    mid = bits_list[len(bits_list) // 2]
    for name in ALGORITHMS:
        pts = sorted((r["d"], r["ms"]) for r in rows if r["algorithm"] == name and
                     r["bits"] == mid)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    axes[0].set(xlabel="attributes d", ylabel="ms per operation", yscale="log",
                title=f"Cost per algorithm ({mid}-bit attributes, {report['backend']})")
    axes[0].legend(fontsize=7)
    dims = sorted({r["d"] for r in rows})
    for k, d in enumerate(dims):
        for m, bits in enumerate(bits_list):
            pts = [(ALGORITHMS.index(r["algorithm"]), r["ratio"]) for r in rows
                   if r["d"] == d and r["bits"] == bits]
            offset = (k * len(bits_list) + m) / (len(dims) * len(bits_list)) * 0.6 - 0.3
            axes[1].scatter([x + offset for x, _ in pts], [y for _, y in pts], s=14,
                            color=f"C{k}", marker="os^D"[m % 4],
                            label=f"d={d}, {bits} bits" if k == 0 or m == 0 else None)
    axes[1].axhline(1.5, color="tab:red", linestyle="--", label="goal 1.5x")
    axes[1].axhline(1.0, color="grey", linewidth=0.8)
    axes[1].set_xticks(range(len(ALGORITHMS)), ALGORITHMS, rotation=30, ha="right", fontsize=8)
    axes[1].set(ylabel="measured / floor", ylim=(0, None),
                title="Ratio to the floor of raw pairing operations (same run)")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run_crypto_bench(json_path: Path, dims: list[int], bits_list: list[int], min_seconds: float,
         backend: str | None) -> dict[str, Any]:
    from ibe_pubsub.credentials import load_group

    group = load_group(backend)
    report = run(group, dims, bits_list, min_seconds,
                 lambda msg: print(f"[bench crypto] {msg}", file=sys.stderr, flush=True))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2))
    plot(report, json_path.with_suffix(".png"))
    return report
