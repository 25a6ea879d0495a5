"""Experiment 5: encryption operations a publisher (or broker) performs per event,
against the number of subscribers, for four ways of keeping events confidential.

* ``public_key``: one public-key encryption per interested subscriber.
* ``op_simple`` / ``op_clustered``: Opyrchal and Prakash's subgroup keys with a
  warm cache at the broker. The broker caches ``<G, K_G>`` per set G of
  interested subscribers; a hit costs one encryption ``{E}K_G``, a miss costs
  ``{E}K_G`` plus ``{K_G}K_S`` for each member S (the new key goes to every
  member under its pair key) and caches the entry. The clustered variant splits
  the subscribers into fixed clusters by id, each with its own smaller cache,
  and encrypts once per cluster that has interested members.
* ``kbz``: Koglin, Bertino and Zou's single encryption. Subscribers sharing a
  subscription share a group key K_i; the broker encrypts the event once under a
  fresh key T and adds ``h(K_i xor r) xor T`` for each group with interested
  members: one encryption plus one one-way-function evaluation per group.
* ``ours``: the scheme's ``encrypt_and_sign`` (docs/scheme.md); its raw group operations are read
  from the group's operation counter while it encrypts the workload's events.
  It is given no subscriber at all, so its count cannot depend on their number.

The operations are of different kinds (public-key, symmetric, hash, pairing
group), so the run also prices them: it times an ECIES encryption (X25519,
HKDF, AES-GCM), an AES-GCM encryption and a SHA-256 in the same run, and times
``encrypt_and_sign`` itself, giving the publisher's seconds per event next to
the operation counts.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ibe_pubsub.credentials import Credential, PairingGroup
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.evaluation.bench_crypto import time_per_call
from ibe_pubsub.evaluation.stock_workload import Workload, make_workload

#: Broker cache sizes, after the seed's settings (10,000 entries; clusters of 10
#: subscribers with 1,000 entries each).
SIMPLE_CACHE = 10_000
CLUSTER_SIZE = 10
CLUSTER_CACHE = 1_000
SCHEMES = ("public_key", "op_simple", "op_clustered", "kbz", "ours")


class SubgroupKeyCache:
    """A broker's LRU caches of subgroup keys, one per cluster of subscribers."""

    def __init__(self, cluster_size: int, capacity: int) -> None:
        self.cluster_size = cluster_size
        self.capacity = capacity
        self.caches: dict[int, OrderedDict[frozenset[int], None]] = {}

    def encryptions(self, interested: Sequence[int]) -> int:
        """Encryptions to send one event to ``interested``; updates the caches."""
        parts: dict[int, set[int]] = {}
        for s in interested:
            parts.setdefault(s // self.cluster_size, set()).add(s)
        total = 0
        for cluster, members in parts.items():
            cache = self.caches.setdefault(cluster, OrderedDict())
            group = frozenset(members)
            if group in cache:
                cache.move_to_end(group)
                total += 1
                continue
            total += 1 + len(group)
            cache[group] = None
            if len(cache) > self.capacity:
                cache.popitem(last=False)
        return total


def unit_costs(min_seconds: float) -> dict[str, float]:
    """Seconds for one public-key encryption (ECIES over X25519), one AES-GCM encryption
    of a short event, and one SHA-256 of a key, measured now on this machine."""
    recipient = X25519PrivateKey.generate().public_key()
    payload, key = os.urandom(128), AESGCM(os.urandom(16))
    nonce = os.urandom(12)

    def ecies() -> bytes:
        ephemeral = X25519PrivateKey.generate()
        shared = ephemeral.exchange(recipient)
        k = HKDF(hashes.SHA256(), 16, None, b"ecies").derive(shared)
        return AESGCM(k).encrypt(nonce, payload, None)

    return {"public_key": time_per_call(ecies, min_seconds),
            "symmetric": time_per_call(lambda: key.encrypt(nonce, payload, None), min_seconds),
            "hash": time_per_call(lambda: hashlib.sha256(payload[:32]).digest(), min_seconds)}


def kbz_groups(workload: Workload, interested: Sequence[int]) -> int:
    """Subscription groups with interested members: one key derivation each."""
    return len({str(workload.subscriptions[s]) for s in interested})


class OurEncryption:
    """Publishes with the scheme (docs/scheme.md); counts and times each encryption."""

    def __init__(self, group: PairingGroup, workload: Workload) -> None:
        self.group = group
        mpk, msk = S.setup(group)
        self.pp = S.PublicParams(group, mpk, workload.schema)
        self.keys = [S.keygen_publisher(self.pp, msk, Credential(a.name, a.kind, ""), 1)
                     for a in workload.schema.attributes]

    def encrypt(self, event_id: str, values: dict[str, Any]) -> tuple[Counter[str], float]:
        """The group operations of one encryption, and its CPU seconds (the wall time on a
        loaded machine would include waiting for a core)."""
        self.group.counts.clear()
        start = time.thread_time()
        S.encrypt_and_sign(self.pp, self.keys, S.Event(event_id, values, b"quote"))
        return Counter(self.group.counts), time.thread_time() - start


def run(group: PairingGroup, subscriber_counts: Sequence[int], events: int, seed: int,
        min_seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """Mean operations and seconds per event of each scheme, per number of subscribers.

    Caches are warmed with as many events as are measured, as in the seed's runs."""
    progress("pricing public-key, symmetric and hash operations")
    unit = unit_costs(min_seconds)
    rows = []
    for n in subscriber_counts:
        progress(f"encryption operations for {n} subscribers")
        workload = make_workload(n, 2 * events, seed)
        warm, measured = workload.events[:events], workload.events[events:]
        simple = SubgroupKeyCache(max(n, 1), SIMPLE_CACHE)
        clustered = SubgroupKeyCache(CLUSTER_SIZE, CLUSTER_CACHE)
        for values in warm:
            g = workload.interested(values)
            simple.encryptions(g)
            clustered.encryptions(g)
        ops: dict[str, list[float]] = {s: [] for s in SCHEMES}
        seconds: dict[str, list[float]] = {s: [] for s in SCHEMES}
        ours = OurEncryption(group, workload)
        ours.encrypt("warm-up", measured[0])  # fills the per-epoch caches a publisher keeps
        breakdown: Counter[str] = Counter()
        interested_sizes = []
        for k, values in enumerate(measured):
            g = workload.interested(values)
            interested_sizes.append(len(g))
            groups = kbz_groups(workload, g)
            counts = {"public_key": len(g), "op_simple": simple.encryptions(g),
                      "op_clustered": clustered.encryptions(g), "kbz": 1 + groups if g else 0}
            costs = {"public_key": len(g) * unit["public_key"],
                     "op_simple": counts["op_simple"] * unit["symmetric"],
                     "op_clustered": counts["op_clustered"] * unit["symmetric"],
                     "kbz": unit["symmetric"] + groups * unit["hash"] if g else 0.0}
            for s in counts:
                ops[s].append(counts[s])
                seconds[s].append(costs[s])
            counted, spent = ours.encrypt(f"e{k}", values)
            breakdown.update(counted)
            ops["ours"].append(sum(counted.values()) + 1)  # + the one AEAD seal of the payload
            seconds["ours"].append(spent)
        rows.append({
            "subscribers": n, "events": len(measured),
            "mean_interested": statistics.fmean(interested_sizes),
            "ops_per_event": {s: statistics.fmean(v) for s, v in ops.items()},
            "ms_per_event": {s: statistics.fmean(v) * 1e3 for s, v in seconds.items()},
            "ours_ops_min": min(ops["ours"]), "ours_ops_max": max(ops["ours"]),
            "ours_group_ops_per_event": {op: c / len(measured)
                                         for op, c in sorted(breakdown.items())},
        })
    return {
        "experiment": "encryption operations per event vs. subscribers",
        "workload": {"schema": "stocks", "seed": seed, "measured_events": events,
                     "warm_up_events": events},
        "parameters": {"simple_cache_entries": SIMPLE_CACHE, "cluster_size": CLUSTER_SIZE,
                       "cluster_cache_entries": CLUSTER_CACHE},
        "unit_costs_ms": {k: v * 1e3 for k, v in unit.items()},
        "units": {"public_key": "public-key encryptions (ECIES)",
                  "op_simple": "symmetric encryptions (event and key-wraps)",
                  "op_clustered": "symmetric encryptions (event and key-wraps)",
                  "kbz": "one symmetric encryption + one hash per group",
                  "ours": "pairing-group operations + one AEAD seal"},
        "rows": rows,
    }


def plot(report: dict[str, Any], path: Any) -> None:
    from ibe_pubsub.evaluation.plots import figure

    rows = report["rows"]
    labels = {"public_key": "public key per subscriber", "op_simple": "Opyrchal-Prakash cache",
              "op_clustered": "Opyrchal-Prakash clustered cache",
              "kbz": "Koglin-Bertino-Zou", "ours": "ours (docs/scheme.md, measured)"}
    x = [r["subscribers"] for r in rows]
    with figure(path, "Publisher work per event", "subscribers",
                [("operations per event", "ops_per_event"),
                 ("ms per event (measured prices)", "ms_per_event")], log=True) as axes:
        for ax, key in axes:
            for s in SCHEMES:
                ax.plot(x, [r[key][s] or None for r in rows], marker="o", label=labels[s])

