"""The soak oracle's trees, rebuilt from peers' log lines: who was above whom, and which
misses a fault excuses (a subscriber's kill excuses only those below it)."""

from __future__ import annotations

import datetime
from pathlib import Path

from ibe_pubsub.evaluation.soak_oracle import analyse
from ibe_pubsub.evaluation.soak_trees import Trees, read_links

T0 = 1_800_000_000.0


def line(t: float, tree: str, vp: str, parent: str) -> str:
    stamp = datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return (f"{stamp} INFO ibe_pubsub.peer.node: {tree} tree: virtual peer {vp} linked to "
            f"{parent} (link 1) in 0.020 s\n")


def test_links_are_read_from_a_peer_log(tmp_path: Path):
    log = tmp_path / "sub.log"
    log.write_text("noise\n" + line(T0 + 1.5, "price", "ab12", "10.0.0.1:1")
                   + "2026-11-27 14:37:37,466 INFO other: price tree: nothing\n")
    assert read_links(log) == [(T0 + 1.5, "price", "ab12", "10.0.0.1:1")]
    assert read_links(tmp_path / "missing.log") == []


def test_ancestors_follow_parents_up_each_tree_at_a_time():
    links = {"a": [(T0, "price", "va", "R")],
             "b": [(T0 + 1, "price", "vb", "A"), (T0 + 5, "price", "vb", "R"),
                   (T0 + 9, "price", "vb", "C")],
             "c": [(T0 + 1, "symbol", "vc", "S"), (T0 + 2, "price", "vc2", "B")]}
    trees = Trees(links, {"A": "a", "B": "b", "C": "c", "R": "root-price",
                          "S": "root-symbol"})
    assert trees.ancestors("b", T0 + 2) == {"a", "root-price"}
    # a relink keeps the parent just left too (generous), until the next one
    assert trees.ancestors("b", T0 + 6) == {"a", "root-price"}
    assert trees.ancestors("b", T0 + 10) == {"root-price", "c"}  # a cycle ends
    assert trees.ancestors("c", T0 + 3) == {"root-symbol", "b", "a", "root-price"}
    assert trees.ancestors("a", T0 - 1) == set()


def record_with_a_miss(victim_above: bool) -> dict:
    """One subscriber ``s`` owed one event, missed, sent 1 s into the kill of ``k``;
    ``s`` linked below ``k`` or below the root."""
    parent = "K" if victim_above else "R"
    incarnation = {"ready": T0 - 100, "ended": T0 + 1000, "paused": []}
    return {
        "started": T0, "settings": {"failure_timeout": 5.0, "minutes": 1, "epoch_seconds": 60,
                                    "grace_seconds": 10},
        "subscriptions": {"s": "price < 500", "k": "price < 500"},
        "incarnations": [{**incarnation, "name": "s", "role": "subscriber", "address": "S",
                          "pid": 1, "started": T0 - 100, "end": "stopped", "returncode": 0},
                         {**incarnation, "name": "k", "role": "subscriber", "address": "K",
                          "pid": 2, "started": T0 - 100, "end": "killed", "returncode": -9,
                          "ended": T0 + 10},
                         {**incarnation, "name": "root-price", "role": "root", "address": "R",
                          "pid": 3, "started": T0 - 100, "end": "stopped", "returncode": 0}],
        "faults": [{"kind": "subscriber_kill", "target": "k", "at": 10.0, "until": 15.0,
                    "started": T0 + 10, "ended": T0 + 15}],
        "sent": {"e1": {"publisher": "pub-v2", "values": {"symbol": "IBM", "price": 10.0,
                                                         "volume": 5}, "sent_at": T0 + 11}},
        "deliveries": {"s": [], "k": []}, "samples": [], "revoked_at": None,
        "revoked_epoch": None, "audit": [], "client_answers": {}, "fed": {},
        "revoked_publisher": "pub-revoked", "network": {"skipped": "test"},
        "server_errors": {},
        "links": {"s": [(T0 - 50, "price", "vs", parent)], "k": [(T0 - 60, "price", "vk", "R")]},
    }


def test_a_kill_excuses_the_misses_below_the_victim_only():
    below, beside = analyse(record_with_a_miss(True)), analyse(record_with_a_miss(False))
    assert below["lost"] == 0 and below["missed_in_fault_windows"] == {"subscriber_kill": 1}
    assert beside["lost"] == 1 and beside["lost_examples"][0]["subscriber"] == "s"
