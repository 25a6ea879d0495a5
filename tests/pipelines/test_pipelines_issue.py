"""`bulk issue` against a real key server: bundles, refusals, resume after a kill, exactly once."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.schema import Schema, default_schema
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.evaluation.synthetic_requests import random_predicate
from ibe_pubsub.keyserver.bundles import decode_publisher_bundle, decode_subscriber_bundle
from ibe_pubsub.keyserver.client import KeyServerClient
from ibe_pubsub.pipelines.local_job import run_local
from ibe_pubsub.pipelines.requests import Settings

SCHEMA = default_schema()
_runs = itertools.count()


def _decompose(tmp_path: Path, count: int, schema: Schema = SCHEMA) -> tuple[Path, list[str]]:
    """A `bulk decompose` output of ``count`` fresh identities (plain-Python driver)."""
    import random

    prefix = f"pl-{uuid.uuid4().hex[:8]}-"
    rng = random.Random(next(_runs))
    names = [f"{prefix}{i}" for i in range(count)]
    table = pa.table({"identity": names,
                      "role": ["subscriber" if i % 3 else "publisher" for i in range(count)],
                      "predicate": [random_predicate(schema, rng).replace(" > ", " >= ")
                                    .replace(" < ", " <= ") for _ in range(count)]})
    tmp_path.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, tmp_path / "requests.parquet")
    out = tmp_path / "decomposed"
    summary = run_local(Settings(schema), tmp_path / "requests.parquet", out)
    assert summary.accepted == count
    return out, names


def _issue_command(server, source: Path, keys: Path, *extra: str) -> list[str]:
    return cli_command("bulk", "issue", "--server", server.base_url, "--input", str(source),
                       "--output", str(keys), *extra)


def _env(server) -> dict[str, str]:
    return {**child_env(), "IBE_PUBSUB_ADMIN_TOKEN": server.admin_token}


def _issued(server, names: list[str]) -> list[str]:
    """Identities of every `issue_bulk` audit entry about ``names`` (repeats included)."""
    wanted, found, after = set(names), [], 0
    with KeyServerClient(server.base_url, server.admin_token) as admin:
        while page := admin.audit(after=after, limit=500):
            found += [e["detail"]["identity"] for e in page if e["action"] == "issue_bulk"
                      and e["detail"]["identity"] in wanted]
            after = page[-1]["id"]
    return found


def test_bulk_issue_writes_one_usable_bundle_per_identity(keyserver, tmp_path):
    source, names = _decompose(tmp_path, 7)
    keys = tmp_path / "keys"
    done = subprocess.run(_issue_command(keyserver, source, keys, "--chunk-size", "3"),
                          env=_env(keyserver), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "7 identities: 7 bundles written now" in done.stdout
    assert "7/7 identities" in done.stderr  # the progress line
    group = load_group()
    credentials = {}
    for row in pq.read_table(source / "credentials").to_pylist():
        credentials.setdefault(row["identity"], set()).add((row["credential"], row["fine"]))
    for i, name in enumerate(names):
        doc = json.loads((keys / f"{name}.json").read_text())
        assert (doc["identity"], doc["role"]) == (name, "subscriber" if i % 3 else "publisher")
        labels = {(c, False) for cs in doc["credentials"].values() for c in cs}
        labels |= {(c, True) for cs in doc.get("fine_credentials", {}).values() for c in cs}
        assert labels == credentials[name]
        if doc["role"] == "subscriber":
            assert decode_subscriber_bundle(group, doc).epoch == doc["epoch"]
        else:
            assert decode_publisher_bundle(group, doc).epoch == doc["epoch"]
        assert (keys / f"{name}.json").stat().st_mode & 0o077 == 0
    assert sorted(_issued(keyserver, names)) == sorted(names)


def test_resume_after_a_kill_issues_nothing_twice(keyserver, tmp_path):
    source, names = _decompose(tmp_path, 24)
    keys = tmp_path / "keys"
    log = keys / ".bulk-issue" / "chunks.jsonl"
    command = _issue_command(keyserver, source, keys, "--chunk-size", "2")
    first = subprocess.Popen(command, env=_env(keyserver), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\n") >= 2):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    finished = log.read_text().count("\n")
    assert 2 <= finished < 12  # really killed half-way
    written = sorted(p.stem for p in keys.glob("*.json"))
    assert 4 <= len(written) < 24

    second = subprocess.run(command, env=_env(keyserver), capture_output=True, text=True,
                            timeout=180)
    assert second.returncode == 0, second.stderr
    assert sorted(p.stem for p in keys.glob("*.json")) == sorted(names)
    assert sorted(_issued(keyserver, names)) == sorted(names)  # each exactly once

    # a chunk that was issued but not logged (killed after the server answered) is
    # re-sent with the same id, and the key server answers from its store
    lines = log.read_text().splitlines()
    last = json.loads(lines[-1])
    log.write_text("\n".join(lines[:-1]) + "\n")
    lost = keys / f"{names[2 * last['index']]}.json"
    before = lost.read_bytes()
    lost.unlink()
    third = subprocess.run(command, env=_env(keyserver), capture_output=True, text=True,
                           timeout=180)
    assert third.returncode == 0, third.stderr
    assert f"{len(names) - 2} from an earlier run" in third.stdout
    assert lost.read_bytes() == before
    assert json.loads(log.read_text().splitlines()[-1])["chunk_id"] == last["chunk_id"]
    assert sorted(_issued(keyserver, names)) == sorted(names)


def test_refusals_mismatches_and_bad_tokens_are_reported(keyserver, tmp_path):
    source, names = _decompose(tmp_path, 3)
    with KeyServerClient(keyserver.base_url, keyserver.admin_token) as admin:
        admin.create_identity(names[1], "publisher")  # the request says subscriber
    keys = tmp_path / "keys"
    done = subprocess.run(_issue_command(keyserver, source, keys), env=_env(keyserver),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 1
    assert f"refused {names[1]}: identity is a publisher" in done.stderr
    refused = [json.loads(line) for line in (keys / "errors.jsonl").read_text().splitlines()]
    assert [r["identity"] for r in refused] == [names[1]]
    assert not (keys / f"{names[1]}.json").exists() and (keys / f"{names[0]}.json").exists()

    other, _ = _decompose(tmp_path / "other", 2)
    mixed = subprocess.run(_issue_command(keyserver, other, keys), env=_env(keyserver),
                           capture_output=True, text=True, timeout=60)
    assert mixed.returncode == 2 and "different input" in mixed.stderr

    bad = subprocess.run(_issue_command(keyserver, source, tmp_path / "k2"),
                         env={**child_env(), "IBE_PUBSUB_ADMIN_TOKEN": "wrong"},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "401" in bad.stderr

    small = Schema.from_dict({"name": "other", "attributes": [
        {"name": "price", "type": "int", "min": 0, "max": 7, "bits": 3}]})
    foreign, _ = _decompose(tmp_path / "foreign", 2, small)
    wrong_schema = subprocess.run(_issue_command(keyserver, foreign, tmp_path / "k3"),
                                  env=_env(keyserver), capture_output=True, text=True,
                                  timeout=60)
    assert wrong_schema.returncode == 2 and "schema" in wrong_schema.stderr


def test_bulk_issue_reads_the_admin_token_file(keyserver, tmp_path):
    source, names = _decompose(tmp_path, 2)
    token_file = tmp_path / "admin.token"
    token_file.write_text(keyserver.admin_token + "\n")
    env = child_env()
    env.pop("IBE_PUBSUB_ADMIN_TOKEN", None)
    done = subprocess.run(_issue_command(keyserver, source, tmp_path / "keys",
                                         "--admin-token-file", str(token_file)),
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert all((tmp_path / "keys" / f"{name}.json").exists() for name in names)
    without = subprocess.run(_issue_command(keyserver, source, tmp_path / "k2"), env=env,
                             capture_output=True, text=True, timeout=60)
    assert without.returncode == 2 and "the admin token is required" in without.stderr
