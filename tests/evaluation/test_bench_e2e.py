"""`bench e2e` at a low rate for 3 s, then at half the rate it achieved, after a warm-up: real
processes, the report's shape, and nothing lost."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ibe_pubsub.cli.bench import register


def test_bench_e2e_delivers_every_event_at_a_low_rate(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="ibe-pubsub")
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "e2e.json"
    args = parser.parse_args(["bench", "e2e", "--modes", "streams", "--rates", "20,50%",
                              "--seconds", "3", "--warmup", "0.5",
                              "--in-process-seconds", "0.2",
                              "--json", str(out)])
    assert args.handler(args) == 0

    report = json.loads(out.read_text())
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(report["in_process"]) == {"streams"}
    assert report["in_process"]["streams"]["publisher_ms_per_event"] > 0
    row, half = report["modes"]["streams"]
    assert (row["rate"], row["asked"], half["asked"]) == (20, "20", "50%")
    assert half["rate"] == round(row["ours"]["achieved_rate"] / 2, 1)
    assert 9 < half["rate"] <= 10.5 and half["ours"]["delivered"] == half["ours"]["expected"]
    assert report["warmup_seconds"] == 0.5
    for side, processes in (("ours", {"publisher", "root"}), ("nats", {"publisher",
                                                                        "nats-server"})):
        r = row[side]
        assert r["events"] == 60
        assert r["expected"] == 4 * 60
        assert r["delivered"] == r["expected"], side
        assert 0 <= r["delay_ms"]["p50"] <= r["delay_ms"]["p95"] <= r["delay_ms"]["p99"]
        assert set(r["cpu_ms_per_event"]) == processes | {f"sub{i}" for i in range(1, 5)} | {
            "subscriber_mean"}
        assert r["cpu_ms_per_event"]["subscriber_mean"] > 0
    assert row["ratios"]["cpu_all_ours_to_nats"] > 0
    assert set(row["ratios"]["cpu_to_in_process"]) == {"publisher", "subscriber"}
