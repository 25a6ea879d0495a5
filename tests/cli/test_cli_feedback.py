"""What commands tell their user: waits announced, the key server's URL when it is ready or
unreachable, the identity list's header, the admin token file, re-published event ids."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import time
import uuid

import pytest
from repository import REPO_ROOT

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.launcher import child_env, cli_command, free_port
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError
from ibe_pubsub.peer.waiting import WaitAnnouncer


def run(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = child_env()
    for name in ("IBE_PUBSUB_TOKEN", "IBE_PUBSUB_ADMIN_TOKEN"):
        env.pop(name, None)
    if token:
        env["IBE_PUBSUB_TOKEN"] = token
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_wait_announcer_speaks_after_two_seconds_then_every_ten():
    now, said = [0.0], []
    announcer = WaitAnnouncer("the roots", limit=30, clock=lambda: now[0], say=said.append)
    for t in (0.0, 1.9, 2.0, 5.0, 11.9, 12.0, 21.0, 22.4):
        now[0] = t
        announcer.tick()
    assert said == [f"waiting for the roots ({s} s so far, giving up after 30 s)"
                    for s in (2, 12, 22)]
    now[0] = 30.0
    assert not announcer.expired
    now[0] = 30.1
    assert announcer.expired

    async def waits() -> tuple[str, str]:
        quick = await WaitAnnouncer("quick", first=5, say=said.append).wait(
            asyncio.sleep(0.01, "done"))
        slow = await WaitAnnouncer("slow", first=0.05, every=0.1, say=said.append).wait(
            asyncio.sleep(0.32, "late"))
        return quick, slow

    said.clear()
    assert asyncio.run(waits()) == ("done", "late")
    assert said and all(line.startswith("waiting for slow (") for line in said)  # not quick


def test_keyserver_serve_says_where_it_is_ready(keyserver):
    log = (keyserver.data_dir / "server.log").read_text()  # served at the default verbosity
    assert f"key server ready on {keyserver.base_url}\n" in log


def test_unreachable_key_server_errors_name_the_url(keyserver):
    closed = f"http://127.0.0.1:{free_port()}"
    listed = run("identity", "list", "--server", closed, "--admin-token", "t")
    assert listed.returncode == 2
    assert listed.stderr == (f"ibe-pubsub: error: cannot reach the key server at {closed}: "
                             "connection refused\n")
    peer = run("peer", "run", "--server", closed, "--subscribe", "", "--server-wait", "0",
               token="t")
    assert f"peer could not start: cannot reach the key server at {closed}: " \
           "connection refused" in peer.stderr

    def refusal(url: str, **options: float) -> str:
        with pytest.raises(KeyServerRequestError) as info, KeyServerClient(
                url, retries=0, **options) as client:
            client.health()
        assert info.value.status == 0
        return str(info.value)

    tls = keyserver.base_url.replace("http://", "https://")
    assert refusal(tls).startswith(f"cannot reach the key server at {tls}: TLS failed: ")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert refusal(url, timeout=0.3) == (f"cannot reach the key server at {url}: "
                                             "no answer in time (timed out)")
    assert refusal("http://no-such-host.invalid:8700").startswith(
        "cannot reach the key server at http://no-such-host.invalid:8700: cannot resolve")


def test_identity_list_has_a_header_and_takes_the_token_file(keyserver, tmp_path):
    token_file = tmp_path / "admin.token"
    token_file.write_text(keyserver.admin_token + "\n")
    admin = ("--server", keyserver.base_url, "--admin-token-file", str(token_file))
    name = f"listed-{uuid.uuid4().hex[:8]}"
    added = run("identity", "add", *admin, "--name", name, "--role", "subscriber")
    assert added.returncode == 0, added.stderr
    listing = run("identity", "list", *admin)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["id", "name", "role", "state", "policy"]
    assert [line.split()[1:4] for line in lines if name in line] == [
        [name, "subscriber", "active"]]
    as_json = json.loads(run("identity", "list", *admin, "--json").stdout)
    assert name in {row["name"] for row in as_json}

    token_file.write_text("not-the-admin-token\n")  # the control: a wrong token is refused
    wrong = run("identity", "list", *admin)
    assert wrong.returncode == 2 and "401" in wrong.stderr
    missing = run("identity", "list", "--server", keyserver.base_url, "--admin-token-file",
                  str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("ibe-pubsub: error: cannot read the admin token from ")
    assert len(missing.stderr.splitlines()) == 1


def test_publish_announces_its_waits_and_warns_on_reused_ids(keyserver_factory, tmp_path):
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path / "peers", verbose=True)

    def publish(ids: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
        events = tmp_path / "events.jsonl"
        events.write_text("".join(json.dumps({"id": i, "body": "hi", "values": {
            "symbol": "IBM", "price": 10.5, "volume": 7}}) + "\n" for i in ids))
        return run("publish", "--server", server.base_url, "--advertise", "",
                   "--events", str(events), *extra, token=token)

    try:
        token = cluster.identity("feedback-pub", "publisher")
        alone = publish(["r1"], "--root-timeout", "5")  # no root registered yet
        assert alone.returncode == 2
        assert re.search(r"^waiting for the root\(s\) of price, symbol, volume to register "
                         rf"with the key server at {server.base_url} \([2-4] s so far, giving "
                         r"up after "
                         r"5 s\)$", alone.stderr, re.MULTILINE), alone.stderr
        assert "no root registered for price, symbol, volume" in alone.stderr

        roots = cluster.start_root("roots", list(default_schema().names))
        sub = cluster.start_subscriber("sub", 'symbol = "IBM"')
        cluster.wait_ready([roots, sub])
        first = publish(["r1", "r2", "r3"])
        assert first.returncode == 0, first.stderr
        assert "published before" not in first.stderr
        cluster.wait_deliveries({"sub": {"r1", "r2", "r3"}}, settle=0)
        assert {d["id"] for d in sub.delivered()} == {"r1", "r2", "r3"}, sub.log_tail()

        again = publish(["r1", "r2", "r3"])
        assert again.returncode == 0, again.stderr
        warnings = [line for line in again.stderr.splitlines() if "published before" in line]
        assert warnings == [
            f"ibe-pubsub: warning: 3 of 3 event id(s) were published before by this publisher "
            f"to {server.base_url}: 'r1', 'r2', 'r3'; subscribers that delivered them drop "
            "these events as duplicates (new ids deliver them again)"]
        fresh = publish(["r4"])
        assert fresh.returncode == 0 and "published before" not in fresh.stderr

        cluster.wait_deliveries({"sub": {"r4"}}, settle=0)
        deadline = time.monotonic() + 30
        while "(3 dropped so far)" not in sub.log_file.read_text():
            assert time.monotonic() < deadline, sub.log_tail()
            time.sleep(0.2)
        assert "dropped event 'r1': an event of this id was delivered before" in \
            sub.log_file.read_text()
    finally:
        cluster.stop_all()
    assert sorted(d["id"] for d in sub.delivered()) == ["r1", "r2", "r3", "r4"]
    stats = sub.stats()
    assert stats["repeated_ids"] == 3
    # docs/events.md documents exactly the fields a subscriber writes to --stats-out
    written = {f"{key}.{inner}" if isinstance(value, dict) else key
               for key, value in stats.items()
               for inner in (value if isinstance(value, dict) else [None])}
    table = (REPO_ROOT / "docs" / "events.md").read_text().split("(`--stats-out`)\n")[1]
    assert set(re.findall(r"^\| `([\w.]+)` \|", table, re.MULTILINE)) == written
