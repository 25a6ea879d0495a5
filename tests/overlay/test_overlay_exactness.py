"""Exact delivery on every seed: a small version of `bench exactness`, and the setup in
which multi-credential routing once missed events with no attacker."""

import argparse
import json
from pathlib import Path

import pytest
from overlay_sims import settled

from ibe_pubsub.cli.bench import register
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.exactness import SCHEMAS, Timing, cases, run_case
from ibe_pubsub.overlay.checks import delivery_errors
from ibe_pubsub.overlay.config import OverlayConfig


def test_every_owed_event_arrives_in_both_schemas_modes_and_under_churn():
    timing = Timing(events=60, drain=5.0)
    runs = [run_case(c, timing) for c in cases(SCHEMAS, ("ohf", "mcr"), (30,), (False, True),
                                               (1, 2))]
    assert [r["examples"] for r in runs if r["missing"] or r["extra"]] == []
    steady = [r for r in runs if not r["churn"]]
    # without churn only what is published while the last joins finish is not owed
    assert sum(r["not_owed"] for r in steady) < 0.1 * sum(r["expected"] for r in steady)
    assert sum(r["expected"] for r in runs) > 500
    assert all(r["not_owed"] > 0 for r in runs if r["churn"])  # churn did cut some off


def test_mcr_delivers_every_match_with_150_subscribers_joining_one_every_50_ms():
    """The setup where a subscriber once missed two events of one fine token (seed 1):
    stock schema, plaintext, 150 subscribers one every 50 ms, 80 events 0.2 s apart."""
    sim, workload = settled(default_schema(), OverlayConfig(routing="mcr"), 150, seed=1,
                            settle=20.0, mode="plaintext")
    publisher = sim.add_publisher()
    start = sim.now
    events = {sim.publish(publisher, values, at=start + 0.2 * i): values
              for i, values in enumerate(workload.values() for _ in range(80))}
    sim.run_until(start + 0.2 * 80 + 10)
    assert delivery_errors(sim, events) == []
    assert sum(len(sim.metrics.deliveries.get(e, {})) for e in events) > 900


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ibe-pubsub")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "exactness", *argv])
    return int(args.handler(args))


def test_the_bench_command_writes_every_run_and_a_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "exactness.json"
    assert bench("--out", str(out), "--seeds", "2", "--schemas", "strings", "--subscribers",
                 "8", "--events", "5", "--workers", "1") == 0
    report = json.loads(out.read_text())
    assert report["summary"]["runs"] == len(report["runs"]) == 2 * 2 * 2  # seeds, modes, churn
    assert report["summary"]["missing"] == 0 and report["summary"]["expected"] > 0
    assert "8/8 strings" in capsys.readouterr().err  # progress while it runs


def test_bad_bench_options_are_refused_before_running(tmp_path: Path, capsys) -> None:
    for option, value in (("--seeds", "0"), ("--subscribers", "40,0"), ("--workers", "-1")):
        with pytest.raises(SystemExit) as exc:
            bench("--out", str(tmp_path / "x.json"), option, value)
        assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench("--schemas", "stocks,nope")
    assert exc.value.code == 2 and "unknown schema(s) nope" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
