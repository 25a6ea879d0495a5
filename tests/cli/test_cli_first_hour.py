"""Traps a new operator walks into in the first hour: a demo whose key server dies, a busy
key-server port, a subscription equal to the policy, a URL without its scheme, a schema
file's mistake, the order of the command groups, a bulk identity in the listing. (Ctrl-C
on a ready peer: test_cli_interrupts.py; restarts of a peer: tests/peer/test_peer_restarts.py.)"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from pathlib import Path

from keyserver_fixtures import PASSPHRASE

from ibe_pubsub.credentials import Event, decompose, default_schema, parse_predicate
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.launcher import child_env, cli_command, init_keyserver
from ibe_pubsub.keyserver.client import KeyServerClient


def _children(pid: int) -> list[int]:
    """The direct children of process ``pid`` (Linux)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_demo_whose_key_server_dies_says_so_in_one_line_with_its_own_status(tmp_path):
    """Killed as the demo starts creating identities: one line and status 3 ("could not
    run"), not three chained tracebacks and status 1 (a missed delivery)."""
    demo = subprocess.Popen(
        cli_command("demo", "--peers", "2", "--events", "2", "--workdir", str(tmp_path)),
        env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert demo.stderr is not None
    try:
        line = demo.stderr.readline()
        while line and not line.startswith("[demo] key server ready at"):
            line = demo.stderr.readline()
        assert line, "the demo never started its key server"
        (server,) = _children(demo.pid)  # the key server, its only child so far
        subprocess.run(["kill", "-KILL", str(server)], check=True)
        started = time.monotonic()
        _, err = demo.communicate(timeout=60)
    finally:
        demo.kill()
    print(f"the demo ended {time.monotonic() - started:.1f} s after its key server")
    assert "Traceback" not in err, err
    errors = [x for x in err.splitlines() if not x.startswith(("[demo]", "waiting for"))]
    assert len(errors) == 1 and errors[0].startswith("ibe-pubsub: error: "), err
    assert "key server" in errors[0]
    assert demo.returncode == 3, err


def test_keyserver_serve_on_a_busy_port_is_a_one_line_error(tmp_path):
    data = tmp_path / "ks"
    init_keyserver(data, PASSPHRASE)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            cli_command("keyserver", "serve", "--data", str(data), "--port", str(port)),
            env=child_env(PASSPHRASE), capture_output=True, text=True, timeout=60,
            check=False)
    print(f"refused in {time.monotonic() - started:.1f} s")
    assert done.stderr.splitlines() == [
        f"ibe-pubsub: error: cannot listen on 127.0.0.1:{port}: address already in use "
        "(another process serves there: stop it, or choose another --port)"], done.stderr
    assert done.returncode == 2


def test_a_subscription_equal_to_its_policy_is_served_by_default(keyserver_factory, tmp_path):
    """``price < 100`` under the policy ``price < 100`` with the default --max-credentials 4:
    the cap gives way to the fewest credentials inside the policy (7), instead of a 403."""
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path)
    try:
        cluster.wait_ready([cluster.start_root("root", ["symbol", "price", "volume"])])
        token = cluster.identity("below-100", "subscriber", "price < 100")
        subscriber = cluster.start_subscriber("below-100", "price < 100", token=token)
        cluster.wait_ready([subscriber])
        events = [Event("cheap", {"symbol": "IBM", "price": 50.0, "volume": 1}, b"50"),
                  Event("dear", {"symbol": "IBM", "price": 150.0, "volume": 1}, b"150")]
        assert cluster.publish("feed", events).returncode == 0
        cluster.wait_deliveries({"below-100": {"cheap"}}, timeout=20, settle=0.5)
    finally:
        cluster.stop_all()
    assert [d["id"] for d in subscriber.delivered()] == ["cheap"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), env=env or child_env(), capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_help_lists_the_command_groups_as_a_new_user_meets_them():
    listed = _run("--help").stdout.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    groups = [line.split()[0] for line in listed.splitlines() if line.startswith("    ")
              and not line.startswith("     ")]
    assert groups == ["demo", "keyserver", "identity", "peer", "publish", "bulk", "bridge",
                      "bench", "crypto"]


def test_server_takes_host_and_port_without_a_scheme(keyserver):
    env = child_env() | {"IBE_PUBSUB_ADMIN_TOKEN": keyserver.admin_token}
    bare = keyserver.base_url.removeprefix("http://")
    listed = _run("identity", "list", "--server", bare, env=env)
    assert listed.returncode == 0 and listed.stdout.split()[0] == "id", listed.stderr
    wrong = _run("identity", "list", "--server", f"ftp://{bare}", env=env)
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[-1].endswith(
        f"error: argument --server: expected the key server's URL, http://HOST:PORT or "
        f"https://HOST:PORT (or HOST:PORT), got 'ftp://{bare}'"), wrong.stderr


def test_a_schema_file_that_does_not_conform_is_one_error_line(tmp_path):
    schema = tmp_path / "mine.toml"
    schema.write_text('name = "mine"\n')
    for how in (("--schema", str(schema)), ()):  # a flag, then the environment
        env = child_env() | ({} if how else {"IBE_PUBSUB_SCHEMA": str(schema)})
        done = _run("keyserver", "init", "--data", str(tmp_path / "ks"), *how, env=env)
        assert done.stderr.splitlines() == [
            f"ibe-pubsub: error: the schema file {schema}: schema needs an 'attributes' array "
            "of tables"]
        assert done.returncode == 2 and not (tmp_path / "ks").exists()
    unknown = _run("keyserver", "init", "--data", str(tmp_path / "ks"), "--schema", "stock")
    assert unknown.stderr.startswith("usage:")  # the command line is wrong: its usage


def test_identity_list_shows_a_bulk_identity_as_bulk_only_with_what_it_was_issued(keyserver):
    name = f"bulk-{uuid.uuid4().hex[:8]}"
    schema = default_schema()
    credentials = [c for cs in decompose(schema, parse_predicate(
        schema, 'symbol prefix "IB" and price < 250')).values() for c in cs]
    with KeyServerClient(keyserver.base_url, keyserver.admin_token) as admin:
        admin.bulk(f"chunk-{name}", [{"identity": name, "role": "subscriber", "credentials": [
            {"attribute": c.attribute, "credential": c.label(), "position": c.position}
            for c in credentials]}])
        epoch = admin.epoch()["epoch"]
    listed = _run("identity", "list", "--server", keyserver.base_url,
                  env=child_env() | {"IBE_PUBSUB_ADMIN_TOKEN": keyserver.admin_token})
    (row,) = [line for line in listed.stdout.splitlines() if f" {name} " in line]
    labels = " ".join(c.label() for c in credentials)
    assert row.split(name, 1)[1].split() == [
        "subscriber", "active,", "bulk-only", "(bulk,", "epoch", f"{epoch})", *labels.split()]
