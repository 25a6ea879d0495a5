"""Bulk enrolment without Spark: per-request decomposition, chunking, KEYDIR state."""

from __future__ import annotations

import csv
import json
import stat
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import decompose, fine_credentials
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.pipelines.chunks import chunked, read_items
from ibe_pubsub.pipelines.keydir import ChunkRecord, KeyDir, KeyDirError
from ibe_pubsub.pipelines.local_job import run_local
from ibe_pubsub.pipelines.requests import (
    MAX_ROWS_PER_IDENTITY,
    Rejected,
    Settings,
    decompose_request,
)

SCHEMA = default_schema()
SETTINGS = Settings(SCHEMA)
PREDICATE = 'symbol prefix "IB" and price in [10, 20.5] and volume >= 1000'


def test_subscriber_rows_are_the_library_decomposition_plus_fine_credentials():
    rows = decompose_request(SETTINGS, "alice", "subscriber", PREDICATE)
    coarse = decompose(SCHEMA, parse_predicate(SCHEMA, PREDICATE))
    fine = fine_credentials(SCHEMA, coarse, 1)
    expected = [(c, False) for cs in coarse.values() for c in cs] + \
        [(c, True) for cs in fine.values() for c in cs]
    assert [(Credential.from_label(r.credential), r.fine) for r in rows] == expected
    assert all(r.position == Credential.from_label(r.credential).position
               and r.attribute == Credential.from_label(r.credential).attribute for r in rows)
    assert any(r.fine for r in rows)


def test_publishers_get_no_fine_credentials_and_empty_predicate_means_roots():
    rows = decompose_request(SETTINGS, "bob", "publisher", PREDICATE)
    assert rows and not any(r.fine for r in rows)
    roots = decompose_request(SETTINGS, "carol", "publisher", "")
    assert [(r.attribute, r.position) for r in roots] == [(n, 0) for n in SCHEMA.names]


@pytest.mark.parametrize(("identity", "role", "predicate", "copies", "reason"), [
    (None, "subscriber", "", 1, "missing identity"),
    ("", "subscriber", "", 1, "missing identity"),
    ("has space", "subscriber", "", 1, "identity must be"),
    ("x" * 201, "subscriber", "", 1, "identity must be"),
    ("dave", "root", "", 1, "role must be"),
    ("dave", None, "", 1, "role must be"),
    ("dave", "subscriber", "", 2, "appears in 2 requests"),
    ("dave", "subscriber", None, 1, "missing predicate"),
    ("dave", "subscriber", "price >", 1, "predicate:"),
    ("dave", "subscriber", "colour = 3", 1, "predicate:"),
    ("dave", "subscriber", "price > 5000", 1, "selects no value"),
    ("dave", "subscriber", 'price = "IBM"', 1, "predicate:"),
])
def test_bad_requests_are_rejected_with_a_reason(identity, role, predicate, copies, reason):
    with pytest.raises(Rejected, match=reason):
        decompose_request(SETTINGS, identity, role, predicate, copies)


def test_too_many_credentials_are_rejected_before_the_key_server_would():
    deep = Settings(SCHEMA, fine_depth=4)
    text = "price in [0.01, 999.9] and volume in [1, 999999]"
    with pytest.raises(Rejected, match=f"limit of {MAX_ROWS_PER_IDENTITY}"):
        decompose_request(deep, "erin", "subscriber", text)
    assert decompose_request(deep, "erin", "publisher", text)  # no fine rows: fits


def _items(n: int, rows: int = 3) -> list[dict]:
    return [{"identity": f"id{i}", "role": "publisher",
             "credentials": [{"attribute": "price", "credential": "price:*", "fine": False,
                              "position": 0}] * rows} for i in range(n)]


def test_chunks_respect_both_limits_and_have_stable_distinct_ids():
    chunks = list(chunked(_items(10, rows=3), max_identities=4, max_rows=9))
    assert [len(c.items) for c in chunks] == [3, 3, 3, 1]
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    again = list(chunked(_items(10, rows=3), max_identities=4, max_rows=9))
    assert [c.chunk_id("run") for c in chunks] == [c.chunk_id("run") for c in again]
    assert len({c.chunk_id("run") for c in chunks}) == 4
    assert chunks[0].chunk_id("run") != chunks[0].chunk_id("other-run")
    big = list(chunked(_items(2, rows=20), max_identities=50, max_rows=5))
    assert [len(c.items) for c in big] == [1, 1]  # an item above max_rows still goes alone


def test_items_are_read_back_per_identity_in_order(tmp_path):
    requests = pa.table({"identity": ["a", "b", "c"], "role": ["subscriber", "publisher", "x"],
                         "predicate": [PREDICATE, "price < 10", ""]})
    pq.write_table(requests, tmp_path / "in.parquet")
    summary = run_local(SETTINGS, tmp_path / "in.parquet", tmp_path / "out")
    assert (summary.requests, summary.accepted, summary.rejected) == (3, 2, 1)
    items = list(read_items(tmp_path / "out"))
    assert [(i["identity"], i["role"]) for i in items] == [("a", "subscriber"),
                                                           ("b", "publisher")]
    assert sum(len(i["credentials"]) for i in items) == summary.credential_rows
    assert items[0]["credentials"][0] == {
        "attribute": "symbol", "credential": 'symbol:"IB"', "fine": False, "position": 2}


def test_keydir_refuses_a_different_run_and_recovers_a_torn_log(tmp_path):
    keydir = KeyDir.open(tmp_path / "keys", {"input": "abc", "max_identities": 5})
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert KeyDir.open(tmp_path / "keys", {"input": "abc", "max_identities": 5}).run == keydir.run
    with pytest.raises(KeyDirError, match="different input"):
        KeyDir.open(tmp_path / "keys", {"input": "xyz", "max_identities": 5})
    keydir.record(ChunkRecord(0, "c0", 7, ()))
    log = tmp_path / "keys" / ".bulk-issue" / "chunks.jsonl"
    with log.open("a") as handle:
        handle.write('{"index": 1, "chunk_')  # killed while appending
    assert list(keydir.finished()) == [0]
    keydir.record(ChunkRecord(1, "c1", 7, ({"identity": "z", "error": "revoked"},)))
    assert keydir.finished()[1].errors == ({"identity": "z", "error": "revoked"},)
    keydir.write_bundle({"identity": "alice", "role": "publisher", "publisher_keys": []})
    path = keydir.bundle_path("alice")
    assert json.loads(path.read_text())["identity"] == "alice"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in (tmp_path / "keys").iterdir() if p.name.endswith(".tmp")] == []


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(*args), env=env or child_env(), capture_output=True,
                          text=True, timeout=120)


def test_commands_have_help_and_the_python_engine_runs_without_a_jvm(tmp_path):
    for command in (("bulk", "decompose"), ("bulk", "issue"), ("bench", "bulk")):
        shown = _cli(*command, "--help")
        assert shown.returncode == 0 and "--" in shown.stdout, command
    (tmp_path / "good.csv").write_text('identity,role,predicate\nann,publisher,"price < 3"\n')
    (tmp_path / "mixed.csv").write_text('identity,role,predicate\nann,publisher,"price < 3"\n'
                                        "bea,subscriber,price <\n")
    (tmp_path / "bad.csv").write_text("identity,role,predicate\nbea,subscriber,price <\n")

    def decompose(name: str, *options: str) -> subprocess.CompletedProcess:
        return _cli("bulk", "decompose", "--schema", "stocks", "--input", str(tmp_path / name),
                    "--output", str(tmp_path / "out"), "--engine", "python", *options)

    done = decompose("good.csv")
    assert done.returncode == 0, done.stderr
    assert "1 requests: 1 accepted" in done.stdout and "0 rejected" in done.stdout
    again = decompose("good.csv")
    assert again.returncode == 2 and "--overwrite" in again.stderr

    # Exit status 1 when a request is rejected, unless --allow-rejects accepts a partial run
    partly = decompose("mixed.csv", "--overwrite")
    assert partly.returncode == 1 and "2 requests: 1 accepted" in partly.stdout
    assert "rejected: mixed.csv line 3 (bea): predicate:" in partly.stderr
    assert partly.stderr.splitlines()[-1] == (
        f"ibe-pubsub: error: 1 of 2 request(s) rejected, all in {tmp_path / 'out' / 'rejected'} "
        "(Parquet; --rejected-csv FILE writes them as CSV); fix them, or pass --allow-rejects "
        "to accept the partial run")
    allowed = decompose("mixed.csv", "--overwrite", "--allow-rejects", "--rejected-csv",
                        str(tmp_path / "rejected.csv"))
    assert allowed.returncode == 0, allowed.stderr
    assert f"all in {tmp_path / 'rejected.csv'} and" in allowed.stderr
    with (tmp_path / "rejected.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["file", "line", "identity", "reason", "row"]
    assert [r[:3] + r[4:] for r in rows[1:]] == [["mixed.csv", "3", "bea",
                                                  "bea,subscriber,price <"]]
    assert rows[1][3].startswith("predicate: ")
    none = decompose("bad.csv", "--overwrite", "--allow-rejects")
    assert none.returncode == 1
    assert none.stderr.splitlines()[-1].startswith(
        "ibe-pubsub: error: no request was accepted; 1 of 1 request(s) rejected")

    no_token = _cli("bulk", "issue", "--server", "http://127.0.0.1:9", "--input",
                    str(tmp_path / "out"), "--output", str(tmp_path / "keys"))
    assert no_token.returncode == 2 and "admin token is required" in no_token.stderr
    bad_schema = _cli("bulk", "decompose", "--schema", str(tmp_path / "good.csv"), "--input",
                      str(tmp_path / "good.csv"), "--output", str(tmp_path / "o2"))
    assert bad_schema.returncode == 2 and "schema" in bad_schema.stderr


@pytest.mark.parametrize("command", [
    ["bulk", "decompose", "--schema", "stocks", "--input", "in.csv", "--output", "out",
     "--engine", "python"],
    ["bulk", "issue", "--server", "http://127.0.0.1:1", "--admin-token", "t",
     "--input", "out", "--output", "keys"],
])
def test_bulk_commands_without_the_spark_extra_say_which_extra_in_one_line(tmp_path, command):
    # The default Docker image has no pyarrow: the bulk commands must say so, not crash.
    hide = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyspark'] = None; "
            "from ibe_pubsub.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([*cli_command()[:1], "-c", hide, *command], cwd=tmp_path,
                            env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("ibe-pubsub: error: pyarrow is missing; "
                                     "install the 'spark' extra")
