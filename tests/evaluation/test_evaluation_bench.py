"""`bench overlay` with tiny sizes: JSON structure, plots, and the sanity of the numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ibe_pubsub.cli.arguments import CommandError
from ibe_pubsub.cli.bench import register
from ibe_pubsub.evaluation.encryption import SubgroupKeyCache, kbz_groups
from ibe_pubsub.evaluation.stock_workload import make_workload

TINY = ["--peers", "8,16", "--degree-peers", "12", "--degrees", "2,4",
        "--dissemination-peers", "10", "--publishers", "3", "--events-per-publisher", "2",
        "--routing-peers", "8", "--tree-subscribers", "30,60", "--subscribers", "5,50,300",
        "--encryption-events", "6",
        "--calibration-peers", "10", "--calibration-events", "3", "--latency-median-ms", "1",
        "--latency-sigma", "0", "--min-seconds", "0.01", "--workers", "2"]


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ibe-pubsub")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "overlay", *argv])
    return int(args.handler(args))


def _mean(run: dict, key: str) -> float:
    return run[key]["mean"]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench-overlay")
    experiments = "connection,degree,dissemination,routing,trees,encryption"
    assert bench("--out", str(path), "--experiments", experiments, *TINY) == 0
    return path


def load(out: Path, name: str) -> dict:
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((out / f"{name}.json").read_text())


def test_calibration_measures_every_operation_the_peers_ran(out: Path) -> None:
    report = load(out, "calibration")
    for op in ("decode_request", "check_request", "open_request", "decode_event", "route",
               "verify", "decrypt"):
        assert op not in report["not_measured"] and report["calls"][op] > 0
        assert report["costs_ms"][op] > 0
    assert report["real"]["delivery_ratio"] == report["modelled"]["delivery_ratio"] == 1.0


def test_security_costs_show_up_as_delay(out: Path) -> None:
    diss = load(out, "dissemination_vs_peers")
    for row in diss["rows"]:
        secure, plain = row["secure"], row["plaintext"]
        assert secure["delivery_ratio"] == plain["delivery_ratio"] == 1.0
        assert secure["expected_deliveries"] == plain["expected_deliveries"] > 0
        # 1 ms links: verify + decrypt alone cost more than any difference in tree shape
        assert _mean(plain, "dissemination_s") < _mean(secure, "dissemination_s")
    for name, x in (("connection_vs_peers", "peers"), ("connection_vs_degree", "max_children")):
        report = load(out, name)
        assert [r[x] for r in report["rows"]] == ([8, 16] if x == "peers" else [2, 4])
        for row in report["rows"]:
            assert row["secure"]["connection_s"]["count"] > 0
            assert (row["plaintext"]["connection_s"]["median"]
                    < row["secure"]["connection_s"]["median"])
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["overhead_ms"]) == {"connection", "connection_by_degree", "dissemination"}
    assert summary["report_overhead_ms"]["connection"] == [230, 300]


def test_tree_shape_counts_add_up_and_every_event_arrives(out: Path) -> None:
    runs = load(out, "trees")["runs"]
    assert [r["subscribers"] for r in runs] == [30, 60]
    for run in runs:
        assert run["delivery_errors"] == 0 and run["connection_s"]["count"] > 0
        assert set(run["trees"]) == {"symbol", "price", "volume"}
        for tree in run["trees"].values():
            assert tree["virtual_peers"] > 0
            assert tree["under_root_coverable"] <= tree["under_root"] <= tree["virtual_peers"]
        assert 0 < run["root_forwarded"] <= run["event_messages"]


def test_routing_compares_both_strategies_on_the_same_events(out: Path) -> None:
    (row,) = load(out, "routing")["rows"]
    assert row["ohf"]["expected_deliveries"] == row["mcr"]["expected_deliveries"]
    for strategy in ("ohf", "mcr"):
        assert row[strategy]["messages_per_event"] > 0
    # flooding hands peers events their credentials do not match; finer routing fewer
    assert 0 < row["mcr"]["false_positives_per_event"] < row["ohf"]["false_positives_per_event"]
    for strategy in ("ohf", "mcr"):
        counts = row[strategy]
        assert counts["deliveries"] == counts["expected_deliveries"] > 0
        assert counts["false_positives_per_subscriber"] * row["peers"] == pytest.approx(
            counts["false_positives_per_event"] * counts["events"])


def test_our_encryption_does_not_grow_with_subscribers(out: Path) -> None:
    rows = load(out, "encryption")["rows"]
    assert [r["subscribers"] for r in rows] == [5, 50, 300]
    ours = {r["ops_per_event"]["ours"] for r in rows}
    assert len(ours) == 1 and ours.pop() > 10
    public_key = [r["ops_per_event"]["public_key"] for r in rows]
    assert public_key == sorted(public_key) and public_key[-1] > public_key[0]
    for r in rows:
        ops = r["ops_per_event"]
        assert ops["public_key"] == r["mean_interested"]
        assert ops["kbz"] <= 1 + ops["public_key"]
        assert r["ours_group_ops_per_event"]["final_exp"] > 0


def test_subgroup_key_cache_charges_misses_per_member_and_hits_once() -> None:
    cache = SubgroupKeyCache(cluster_size=10, capacity=2)
    assert cache.encryptions([1, 2, 3]) == 4  # {E}K_G and K_G to each of 3 members
    assert cache.encryptions([1, 2, 3]) == 1
    assert cache.encryptions([1, 12]) == 2 + 2  # two clusters, each a miss of one member
    assert cache.encryptions([1, 12]) == 2
    cache.encryptions([4]), cache.encryptions([5])  # evict {1,2,3} from cluster 0 (LRU, 2)
    assert cache.encryptions([1, 2, 3]) == 4
    assert cache.encryptions([]) == 0


def test_kbz_counts_distinct_subscriptions() -> None:
    workload = make_workload(400, 1, seed=3)
    texts = [str(p) for p in workload.subscriptions]
    same = [i for i, t in enumerate(texts) if texts.count(t) > 1]
    assert same, "the workload's vocabulary should make subscriptions recur"
    assert kbz_groups(workload, same) == len({texts[i] for i in same}) < len(same)
    assert kbz_groups(workload, []) == 0


@pytest.mark.parametrize("argv, message", [
    (["--peers", "0"], "peers must be at least 1"),
    (["--loopback-peers", "51"], "at most 50"),
    (["--latency-median-ms", "0"], "latency median"),
])
def test_bad_sizes_are_refused_before_running(tmp_path: Path, argv: list[str],
                                              message: str) -> None:
    with pytest.raises(CommandError, match=message):
        bench("--out", str(tmp_path), *argv)
    assert not any(tmp_path.iterdir())


def test_unknown_experiment_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench("--experiments", "connection,bogus")
    assert exc.value.code == 2
    assert "unknown experiment(s) bogus" in capsys.readouterr().err


@pytest.mark.slow
def test_loopback_cross_check_runs_real_processes_and_the_simulator(tmp_path: Path) -> None:
    assert bench("--out", str(tmp_path), "--experiments", "loopback", "--loopback-peers", "3",
                 "--loopback-events", "6", "--seed", "4") == 0
    report = load(tmp_path, "loopback")
    processes, simulator = report["processes"], report["simulator"]
    assert processes["delivery_ratio"] == simulator["delivery_ratio"] == 1.0
    assert processes["dissemination_s"]["count"] == simulator["dissemination_s"]["count"] > 0
    assert report["mean_ratio_processes_to_simulator"] > 0
    assert 0 < processes["all_joined_s"] < 180
