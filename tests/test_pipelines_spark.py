"""Bulk decomposition on Spark (local mode, one shared session) against the plain-Python driver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from credentials.schema import default_schema
from keyserver.launcher import child_env, cli_command
from pipelines.chunks import read_items
from pipelines.layout import LayoutError, Summary
from pipelines.local_job import run_local
from pipelines.requests import Settings
from pipelines.spark_job import run_spark, spark_session
from pipelines.synthetic import random_requests

SCHEMA = default_schema()
SETTINGS = Settings(SCHEMA)


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", partitions=3, driver_memory="1g")
    yield session
    session.stop()


def _rows(path: Path) -> list[tuple]:
    table = pq.read_table(path)
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


BAD_ROWS = [
    {"identity": None, "role": "subscriber", "predicate": ""},
    {"identity": "bad name", "role": "publisher", "predicate": ""},
    {"identity": "twin", "role": "subscriber", "predicate": "price < 3"},
    {"identity": "twin", "role": "publisher", "predicate": "price < 3"},
    {"identity": "no-role", "role": "admin", "predicate": ""},
    {"identity": "no-pred", "role": "subscriber", "predicate": None},
    {"identity": "typo", "role": "subscriber", "predicate": "price in [3, "},
    {"identity": "empty-set", "role": "publisher", "predicate": "volume < 0"},
]


def test_spark_equals_python_on_random_requests(spark, tmp_path):
    requests = pa.concat_tables([random_requests(SCHEMA, 200, seed=7),
                                 pa.Table.from_pylist(BAD_ROWS, schema=pa.schema(
                                     [(c, pa.string()) for c in
                                      ("identity", "role", "predicate")]))])
    pq.write_table(requests, tmp_path / "requests.parquet")
    on_spark = run_spark(spark, SETTINGS, tmp_path / "requests.parquet", tmp_path / "spark")
    in_python = run_local(SETTINGS, tmp_path / "requests.parquet", tmp_path / "python")

    assert _rows(tmp_path / "spark" / "credentials") == _rows(tmp_path / "python" / "credentials")
    assert _rows(tmp_path / "spark" / "rejected") == _rows(tmp_path / "python" / "rejected")
    counts = ("requests", "accepted", "rejected", "credential_rows", "fine_rows", "schema_id")
    assert [getattr(on_spark, k) for k in counts] == [getattr(in_python, k) for k in counts]
    assert on_spark.requests == 208 and on_spark.rejected >= len(BAD_ROWS)
    assert Summary.read(tmp_path / "spark") == on_spark
    # each identity's rows are contiguous in Spark's output, as `bulk issue` needs
    items = list(read_items(tmp_path / "spark"))
    assert len(items) == on_spark.accepted
    assert sum(len(i["credentials"]) for i in items) == on_spark.credential_rows


def test_bad_rows_end_up_in_rejected_with_reasons(spark, tmp_path):
    csv = tmp_path / "requests.csv"
    csv.write_text(
        "role,identity,predicate,comment\n"
        'subscriber,ok-1,"symbol = ""IBM"" and price >= 10",quotes doubled as in RFC 4180\n'
        'publisher,ok-2,"",quoted empty: every event\n'
        "subscriber,,,no identity\n"
        "subscriber,bad/name,price < 3,slash\n"
        "subscriber,twin,price < 3,\n"
        "publisher,twin,price < 4,\n"
        "owner,no-role,price < 3,\n"
        "subscriber,no-pred,,unquoted empty: missing\n"
        'subscriber,typo,"price in [3, ",\n'
        "publisher,empty-set,volume < 0,\n")
    summary = run_spark(spark, SETTINGS, csv, tmp_path / "out")
    assert (summary.requests, summary.accepted, summary.rejected) == (10, 2, 8)
    rejected = pq.read_table(tmp_path / "out" / "rejected").to_pylist()
    reasons = sorted(r["reason"] for r in rejected)
    expected = ["appears in 2 requests", "appears in 2 requests", "identity must be",
                "missing identity", "missing predicate", "role must be", "selects no value",
                "predicate: expected a number"]
    for fragment in expected:
        assert any(fragment in r for r in reasons), (fragment, reasons)
        reasons.remove(next(r for r in reasons if fragment in r))
    accepted = pq.read_table(tmp_path / "out" / "credentials").to_pylist()
    assert {r["identity"] for r in accepted} == {"ok-1", "ok-2"}
    assert {r["credential"] for r in accepted if r["attribute"] == "symbol"} == \
        {'symbol:"IBM"$', 'symbol:""'}
    assert not any(r["fine"] for r in accepted if r["identity"] == "ok-2")


def test_json_lines_may_omit_keys_but_csv_must_have_the_columns(spark, tmp_path):
    lines = tmp_path / "requests.jsonl"
    lines.write_text('{"identity": "j1", "role": "publisher", "predicate": "price < 5"}\n'
                     '{"identity": "j2", "role": "publisher"}\n')
    summary = run_spark(spark, SETTINGS, lines, tmp_path / "out")
    assert (summary.accepted, summary.rejected) == (1, 1)
    assert _rows(tmp_path / "out" / "rejected")[0][0] == "j2"
    with pytest.raises(LayoutError, match="already holds"):
        run_spark(spark, SETTINGS, lines, tmp_path / "out")
    (tmp_path / "nocol.csv").write_text("identity,predicate\nx,price < 3\n")
    with pytest.raises(LayoutError, match="lacks the column"):
        run_spark(spark, SETTINGS, tmp_path / "nocol.csv", tmp_path / "out2")
    (tmp_path / "requests.txt").write_text("identity,role,predicate\n")
    with pytest.raises(LayoutError, match="format"):
        run_spark(spark, SETTINGS, tmp_path / "requests.txt", tmp_path / "out3")


@pytest.mark.slow
def test_bulk_decompose_command_runs_spark_and_reports(tmp_path):
    """The CLI path end to end: its own Spark session in a child process."""
    schema = Path(sys.modules["credentials"].__file__).parent / "stocks.toml"
    pq.write_table(random_requests(SCHEMA, 50, seed=3), tmp_path / "in.parquet")
    done = subprocess.run(cli_command(
        "bulk", "decompose", "--schema", str(schema), "--input", str(tmp_path / "in.parquet"),
        "--output", str(tmp_path / "out"), "--master", "local[1]", "--partitions", "2"),
        env=child_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["engine"] == "spark" and summary["requests"] == 50
    assert "50 requests" in done.stdout
    again = subprocess.run(cli_command(
        "bulk", "decompose", "--schema", str(schema), "--input", str(tmp_path / "missing.csv"),
        "--output", str(tmp_path / "out2"), "--engine", "python"),
        env=child_env(), capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "does not exist" in again.stderr


@pytest.mark.slow
def test_bench_bulk_smoke(tmp_path):
    out = tmp_path / "bulk.json"
    done = subprocess.run(cli_command("bench", "bulk", "--json", str(out), "--requests", "40",
                                      "--master", "local[1]", "--partitions", "1"),
                          env=child_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["requests"] == 40 and report["python"]["rows_per_s"] > 0
    assert report["ratio"] == report["spark"]["rows_per_s"] / report["python"]["rows_per_s"]
    assert out.with_suffix(".png").stat().st_size > 1000
    assert "ratio Spark/Python" in done.stdout
