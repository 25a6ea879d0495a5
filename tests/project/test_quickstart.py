"""The README's quick start is docs/quickstart.sh, verbatim, and that exact text works.

The script runs as a new user would run it: from a directory outside the repository,
with only the virtual environment's ``bin`` and the system on PATH, a fresh home and
configuration directory, and (in the main run) IBE_PUBSUB_* variables of the user's own
that the script must ignore: a database URL, a token, a published-ids file. The delivered
events are checked against the events the script publishes and the subscription it
makes, through the project's own predicate parser.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repository import REPO_ROOT

from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import resolve_schema
from ibe_pubsub.evaluation.launcher import free_port
from ibe_pubsub.peer.events_io import iter_lines, parse_event, read_deliveries

REPO = REPO_ROOT
SCRIPT = REPO / "docs" / "quickstart.sh"
TIMEOUT = 180


def test_the_readme_includes_the_quickstart_script_verbatim():
    text = SCRIPT.read_text()
    assert f"```sh\n{text}```\n" in (REPO / "README.md").read_text()


def _run_script(tmp_path: Path, keyserver_port: int | None = None,
                user_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "ibe-pubsub").exists(), f"no ibe-pubsub next to {sys.executable}"
    for name in ("home", "config", "tmp", "elsewhere"):
        (tmp_path / name).mkdir()
    env = {"PATH": f"{venv_bin}{os.pathsep}{os.defpath}", "HOME": str(tmp_path / "home"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "TMPDIR": str(tmp_path / "tmp"),
           "KEYSERVER_PORT": str(keyserver_port or free_port()), "ROOT_PORT": str(free_port()),
           "SUBSCRIBER_PORT": str(free_port()), **(user_env or {})}
    process = subprocess.Popen(["bash", str(SCRIPT)], cwd=tmp_path / "elsewhere", env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"quickstart.sh still running after {TIMEOUT} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_the_quickstart_script_delivers_exactly_the_matching_events(tmp_path):
    users_own = {"IBE_PUBSUB_DATABASE_URL": f"sqlite:///{tmp_path / 'users.db'}",
                 "IBE_PUBSUB_TOKEN": "not-a-token",
                 "IBE_PUBSUB_PUBLISHED_IDS": str(tmp_path / "users_ids.json")}
    done = _run_script(tmp_path, user_env=users_own)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    work = Path(re.search(r"working in (\S+)", done.stdout).group(1))
    assert work.parent == tmp_path / "tmp"  # its own directory, from mktemp
    text = SCRIPT.read_text()
    schema = resolve_schema(re.search(r"--schema ([\w./-]+)", text).group(1))
    predicate = parse_predicate(schema, re.search(r"--subscribe '([^']*)'", text).group(1))
    published = [parse_event(schema, obj, f"events.jsonl:{n}")
                 for n, obj in iter_lines(str(work / "events.jsonl"))]
    expected = {e.event_id: e for e in published if predicate.matches(e.values)}
    assert 0 < len(expected) < len(published)  # the subscription filters something
    delivered = read_deliveries(work / "delivered.jsonl")
    assert sorted(d["id"] for d in delivered) == sorted(expected)
    for line in delivered:
        event = expected[line["id"]]
        assert (line["values"], line["body"].encode()) == (event.values, event.body)
    assert (work / "delivered.jsonl").read_text() in done.stdout  # shown to the user
    assert (work / "published_ids.json").exists()  # its record stays in its directory
    assert not (tmp_path / "users.db").exists() and not (tmp_path / "users_ids.json").exists()
    assert not any((tmp_path / "home").iterdir())
    for ready in ("keyserver.ready", "root.ready", "subscriber.ready"):
        assert not _alive(json.loads((work / ready).read_text())["pid"]), ready


def test_the_quickstart_script_fails_at_once_with_the_reason(tmp_path):
    """A key server that cannot start (its port is taken) ends the script with its log,
    instead of a wait of a minute."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        started = time.monotonic()
        done = _run_script(tmp_path, keyserver_port=taken.getsockname()[1])
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert "quickstart: process" in done.stderr and "address already in use" in done.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
