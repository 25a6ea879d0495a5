"""Bulk decomposition on Spark (local mode, one shared session) against the plain-Python driver."""

from __future__ import annotations

import json
import re
import subprocess
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.launcher import child_env, cli_command, free_port
from ibe_pubsub.evaluation.synthetic_requests import random_requests
from ibe_pubsub.pipelines.chunks import read_items
from ibe_pubsub.pipelines.layout import LayoutError, Summary
from ibe_pubsub.pipelines.local_job import run_local
from ibe_pubsub.pipelines.requests import Settings
from ibe_pubsub.pipelines.session import spark_session
from ibe_pubsub.pipelines.spark_job import run_spark

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


def _both_engines(spark, source: Path, tmp_path: Path) -> tuple[Summary, list[dict]]:
    """Decompose ``source`` with Spark and in Python; assert identical outputs; return the
    summary and the rejections by line."""
    on_spark = run_spark(spark, SETTINGS, source, tmp_path / "spark")
    in_python = run_local(SETTINGS, source, tmp_path / "python")
    for name in ("credentials", "rejected"):
        assert _rows(tmp_path / "spark" / name) == _rows(tmp_path / "python" / name), name
        # one part per task, written by the task's Python worker, no temporary file left
        parts = [p.name for p in (tmp_path / "spark" / name).iterdir()]
        assert parts and all(re.fullmatch(r"part-\d{5}\.parquet", p) for p in parts), parts
    counts = ("requests", "accepted", "rejected", "credential_rows", "fine_rows", "schema_id")
    assert [getattr(on_spark, k) for k in counts] == [getattr(in_python, k) for k in counts]
    assert Summary.read(tmp_path / "spark") == on_spark
    rejected = pq.read_table(tmp_path / "python" / "rejected").to_pylist()
    return in_python, sorted(rejected, key=lambda r: r["line"])


def _check_rejections(rejected: list[dict], expected: list[tuple]) -> None:
    """``expected``: (line, identity, fragment of the reason) of every rejection."""
    assert [(r["line"], r["identity"]) for r in rejected] == [e[:2] for e in expected]
    for row, (_, _, fragment) in zip(rejected, expected, strict=True):
        assert fragment in row["reason"], (row, fragment)


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
    summary, rejected = _both_engines(spark, tmp_path / "requests.parquet", tmp_path)
    assert summary.requests == 208 and summary.rejected >= len(BAD_ROWS)
    assert {(r["line"], r["identity"]) for r in rejected} >= {(201, None), (208, "empty-set")}
    # each identity's rows are contiguous in Spark's output, as `bulk issue` needs
    items = list(read_items(tmp_path / "spark"))
    assert len(items) == summary.accepted
    assert sum(len(i["credentials"]) for i in items) == summary.credential_rows


MALFORMED_CSV = (
    b"\xef\xbb\xbfrole , identity,predicate,comment\r\n"  # BOM, spaces, CRLF, a 4th column
    b'subscriber,ok-1,"symbol = ""IBM"" and price >= 10",quotes doubled as in RFC 4180\r\n'
    b'publisher,ok-2,"",quoted empty: every event\n'
    b"\n"
    b'subscriber,ok-3,symbol = "IB",a quote inside an unquoted field is kept\n'
    b"   \n"
    b"subscriber,short\n"
    b"publisher,long,price < 3,x,y\n"
    b"subscriber,,,no identity\n"
    b"owner,bad-role,price < 3,\n"
    b"subscriber,bad-pred,price in [3,\n"
    b'subscriber,unclosed,"price < 3,\n'
    b'subscriber,after,"price < 3"x,\n'
    b"subscriber,no-pred,,unquoted empty: missing\n"
    b'publisher,latin1,symbol = "Z\xfcrich",\n'
    b"subscriber,twin,price < 3,\n"
    b"publisher,twin,price < 4,\n"
    b"publisher,empty-set,volume < 0,"  # no final newline
)


def test_both_engines_read_a_malformed_csv_identically(spark, tmp_path):
    (tmp_path / "requests.csv").write_bytes(MALFORMED_CSV)
    summary, rejected = _both_engines(spark, tmp_path / "requests.csv", tmp_path)
    assert (summary.requests, summary.accepted, summary.rejected) == (15, 3, 12)
    _check_rejections(rejected, [
        (7, "short", "2 field(s), but the header has 4 column(s)"),
        (8, "long", "5 field(s), but the header has 4 column(s); quote a field"),
        (9, None, "missing identity"),
        (10, "bad-role", "role must be 'subscriber' or 'publisher', got 'owner'"),
        (11, "bad-pred", "predicate: expected"),
        (12, "unclosed", "field 3: a quote is not closed on its line"),
        (13, "after", "field 3: text after its closing quote"),
        (14, "no-pred", "missing predicate"),
        (15, "latin1", "not UTF-8: byte 0xfc at column 29"),
        (16, "twin", "appears in 2 requests"),
        (17, "twin", "appears in 2 requests"),
        (18, "empty-set", "selects no value"),
    ])
    assert {r["source"] for r in rejected} == {"requests.csv"}
    assert rejected[0]["raw"] == "subscriber,short"
    assert rejected[8]["raw"] == 'publisher,latin1,symbol = "Z\\xfcrich",'
    accepted = pq.read_table(tmp_path / "spark" / "credentials").to_pylist()
    assert {r["identity"] for r in accepted} == {"ok-1", "ok-2", "ok-3"}
    assert {r["credential"] for r in accepted if r["attribute"] == "symbol"} == \
        {'symbol:"IBM"$', 'symbol:""', 'symbol:"IB"$'}
    assert not any(r["fine"] for r in accepted if r["identity"] == "ok-2")


def test_both_engines_read_malformed_json_lines_identically(spark, tmp_path):
    (tmp_path / "requests.jsonl").write_bytes(
        b'{"identity": "j1", "role": "publisher", "predicate": "price < 5", "note": 1}\n'
        b'{"identity": "j2", "role": "publisher"}\n'
        b"\n"
        b"not json\n"
        b"[1, 2]\n"
        b'{"identity": 7, "role": "publisher", "predicate": ""}\n'
        b'{"identity": "j3", "role": "publisher", "predicate": "price < 5"\n'
        b'{"identity": "j4", "role": "publisher", "predicate": "symbol = \xfc"}\n')
    summary, rejected = _both_engines(spark, tmp_path / "requests.jsonl", tmp_path)
    assert (summary.requests, summary.accepted) == (7, 1)
    _check_rejections(rejected, [
        (2, "j2", "missing predicate"), (4, None, "not JSON"), (5, None, "not a JSON object"),
        (6, None, "identity must be a string or null"), (7, None, "not JSON"),
        (8, None, "not UTF-8"),
    ])
    with pytest.raises(LayoutError, match="already holds"):
        run_spark(spark, SETTINGS, tmp_path / "requests.jsonl", tmp_path / "spark")


def test_an_input_without_requests_leaves_both_outputs_readable(spark, tmp_path):
    (tmp_path / "requests.csv").write_bytes(b"identity,role,predicate\n")
    summary, rejected = _both_engines(spark, tmp_path / "requests.csv", tmp_path)
    assert (summary.requests, summary.credential_rows, rejected) == (0, 0, [])


def test_both_engines_refuse_a_file_of_the_wrong_kind_with_the_same_error(spark, tmp_path):
    good = b"identity,role,predicate\nann,publisher,price < 3\n"
    pq.write_table(pa.table({"identity": ["x"], "role": ["publisher"]}), tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_bytes(good)
    cases = {
        "nocol.csv": (b"identity,predicate\nx,price < 3\n", "the header has no column(s) role"),
        "twice.csv": (b"identity,role,role,predicate\n", "duplicate column(s) role"),
        "empty.csv": (b"\n\n", "is empty; a CSV input starts with a header"),
        "quote.csv": (b'"identity,role,predicate\n', "the header is not CSV"),
        "latin1.csv": (b"identit\xe9,role,predicate\n", "the header is not CSV (not UTF-8"),
        "requests.txt": (good, "cannot tell the format"),
        "dir/": (None, "no column(s) role"),  # a directory with one good and one bad file
    }
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "1.csv").write_bytes(good)
    (tmp_path / "dir" / "2.csv").write_bytes(cases["nocol.csv"][0])
    cases |= {"a.parquet": (None, "a.parquet has no column(s) predicate"),
              "b.parquet": (None, "cannot read")}
    for name, (content, message) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        errors = []
        for run in (run_local, partial(run_spark, spark)):
            with pytest.raises(LayoutError, match=re.escape(message)) as caught:
                run(SETTINGS, tmp_path / name, tmp_path / "out")
            errors.append(str(caught.value))
        assert errors[0] == errors[1], name
        assert not (tmp_path / "out").exists(), name


def _decompose(tmp_path: Path, output: str, *options: str, verbose: bool = False,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(
        *(["-v"] if verbose else []), "bulk", "decompose", "--schema", "stocks", "--input",
        str(tmp_path / "in.parquet"), "--output", str(tmp_path / output), "--master", "local[1]",
        "--partitions", "2", *options), env=env or child_env(), capture_output=True, text=True,
        timeout=240)


def test_a_missing_input_is_a_one_line_error(tmp_path):
    done = subprocess.run(cli_command(
        "bulk", "decompose", "--schema", "stocks", "--input", str(tmp_path / "missing.csv"),
        "--output", str(tmp_path / "out"), "--engine", "python"),
        env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_a_missing_or_broken_java_is_a_one_line_error(tmp_path):
    """The same command with a working Java runs (the bench smoke below on local[1], and
    tests/pipelines/test_spark_cluster.py, which also checks what it prints and logs)."""
    pq.write_table(random_requests(SCHEMA, 3), tmp_path / "in.parquet")
    no_java = child_env() | {"PATH": str(tmp_path)}  # nothing to run there
    no_java.pop("JAVA_HOME", None)
    done = _decompose(tmp_path, "out", env=no_java)
    *_, error = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert error.startswith("ibe-pubsub: error: cannot start Spark: no Java found: JAVA_HOME "
                            "is not set and java is not on PATH; Spark needs Java 17 or newer")
    assert error.endswith("--engine python decomposes without Spark or Java")
    no_jdk = child_env() | {"JAVA_HOME": str(tmp_path / "nowhere")}
    assert "JAVA_HOME is " in _decompose(tmp_path, "out", env=no_jdk).stderr

    # A JVM that exits at once, noisily: the noise goes to the log, or with -v to the terminal.
    (tmp_path / "jdk" / "bin").mkdir(parents=True)
    java = tmp_path / "jdk" / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'fake JVM: could not reserve the heap' >&2\nexit 1\n")
    java.chmod(0o755)
    broken = child_env() | {"JAVA_HOME": str(tmp_path / "jdk")}
    done = _decompose(tmp_path, "out2", env=broken)
    *_, error = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert error == ("ibe-pubsub: error: cannot start Spark: Spark's Java process exited at "
                     f"start-up (details in {tmp_path / 'out2' / 'spark.log'}); Spark needs "
                     "Java 17 or newer; --engine python decomposes without Spark or Java")
    assert "fake JVM" not in done.stderr
    assert "fake JVM" in (tmp_path / "out2" / "spark.log").read_text()
    verbose = _decompose(tmp_path, "out3", verbose=True, env=broken)
    assert verbose.returncode == 2 and "fake JVM" in verbose.stderr
    assert "(details above)" in verbose.stderr.splitlines()[-1]


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
    assert "log4j" in out.with_suffix(".spark.log").read_text() and "log4j" not in done.stderr


def test_remote_and_master_exclude_each_other_and_a_dead_server_is_one_line(tmp_path):
    """--remote problems are one-line errors, before any Spark starts and without the
    Connect client's minutes of retries."""
    pq.write_table(random_requests(SCHEMA, 3), tmp_path / "in.parquet")
    dead = f"sc://127.0.0.1:{free_port()}"
    cases = [
        (["--remote", dead], {}, f"no Spark Connect server at {dead}: cannot connect to "
         f"127.0.0.1:{dead.rsplit(':', 1)[1]} (Connection refused)"),
        (["--remote", dead], {"IBE_PUBSUB_MASTER": "local[1]"},
         "--master and --remote exclude each other"),
        (["--remote", "http://127.0.0.1:1"], {}, "--remote: expected sc://HOST:PORT"),
    ]
    for options, variables, message in cases:
        done = subprocess.run(cli_command(
            "bulk", "decompose", "--schema", "stocks", "--input", str(tmp_path / "in.parquet"),
            "--output", str(tmp_path / "out"), *options), env=child_env() | variables,
            capture_output=True, text=True, timeout=60)
        *_, error = done.stderr.splitlines()
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert error.startswith("ibe-pubsub: error: ") and message in error, error
