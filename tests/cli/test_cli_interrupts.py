"""Stopping commands from outside: a signal ends a waiting peer at once, Ctrl-C and a closed
pipe end a command quietly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyserver_fixtures import PASSPHRASE, KeyServer, KeyServers

from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    init_keyserver,
    wait_ready,
)
from ibe_pubsub.keyserver.client import KeyServerClient


@pytest.fixture(scope="module")
def lonely_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyServer]:
    """A key server of its own, where no peer of another test ever registers a root."""
    servers = KeyServers(tmp_path_factory.mktemp("lonely"))
    try:
        yield servers.start()
    finally:
        servers.stop_all()


def _as_from_a_terminal() -> None:
    """A shell starts a foreground command with SIGINT at its default; a test run launched
    in the background (where SIGINT is ignored, and the ignoring is inherited) must not
    change what Ctrl-C does to the commands under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _waiting_peer(url: str, token: str, workdir: Path, awaited: str) -> subprocess.Popen[str]:
    """A subscriber once it says it is waiting for ``awaited`` (after 2 s of waiting)."""
    env = child_env() | {"IBE_PUBSUB_TOKEN": token,
                         "IBE_PUBSUB_KNOWN_SERVERS": str(workdir / "known_servers.json")}
    process = subprocess.Popen(
        cli_command("peer", "run", "--server", url, "--subscribe", 'symbol = "IBM"'),
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, preexec_fn=_as_from_a_terminal)
    assert process.stderr is not None
    seen = [process.stderr.readline()]
    while not seen[-1].startswith(f"waiting for {awaited}"):
        assert seen[-1], "".join(seen)
        seen.append(process.stderr.readline())
    time.sleep(0.5)
    assert process.poll() is None  # the control: still waiting (it would for 30 s or more)
    return process


def _stopped(process: subprocess.Popen[str], sig: signal.Signals, status: int) -> None:
    """``sig`` ends ``process`` with ``status`` in under 5 s (2 s on a quiet machine; it
    would wait 30 s or more), without a traceback."""
    sent = time.monotonic()
    process.send_signal(sig)
    try:
        _, rest = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    took = time.monotonic() - sent
    print(f"{sig.name}: stopped in {took:.2f} s")
    assert process.returncode == status, rest
    assert took < 5.0
    assert "Traceback" not in rest and "no peer of tree" not in rest, rest
    if sig == signal.SIGINT:  # Ctrl-C: said as every command says it
        assert rest.splitlines()[-1] == "ibe-pubsub: interrupted", rest


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_stops_a_peer_waiting_for_a_root(lonely_server, tmp_path, sig, status):
    token = Cluster(lonely_server.base_url, lonely_server.admin_token, tmp_path).identity(
        f"waiting-{tmp_path.name}", "subscriber")
    _stopped(_waiting_peer(lonely_server.base_url, token, tmp_path,
                           "a root or peer of tree(s) symbol"), sig, status)


def test_a_signal_stops_a_peer_waiting_for_a_silent_key_server(tmp_path):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        _stopped(_waiting_peer(url, "t", tmp_path, "keys from the key server"),
                 signal.SIGINT, 130)


def _interrupted(process: subprocess.Popen[str], group: bool = False) -> str:
    """SIGINT as Ctrl-C sends it (to the whole process group with ``group``); the output
    after it, once the process ended with status 130."""
    if group:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    rest = (out or "") + (err or "")
    assert process.returncode == 130, rest
    return rest


def test_ctrl_c_on_a_ready_peer_says_interrupted_after_leaving(keyserver_factory, tmp_path):
    server = keyserver_factory.start()
    admin = KeyServerClient(server.base_url, server.admin_token)
    token = admin.create_identity("root", "root")["token"]
    peer = subprocess.Popen(
        cli_command("peer", "run", "--server", server.base_url, "--root", "symbol"),
        env=child_env() | {"IBE_PUBSUB_TOKEN": token}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal)
    assert peer.stderr is not None
    try:
        line = peer.stderr.readline()
        while line and not line.startswith("peer ready at"):
            line = peer.stderr.readline()
        assert line, "the peer never got ready"
        assert admin.lookup("symbol")["roots"]  # the control: listed while it runs
        rest = _interrupted(peer)
    finally:
        peer.kill()
    assert rest.splitlines() == ["ibe-pubsub: interrupted"]
    assert not admin.lookup("symbol")["roots"]  # it left the directory first
    admin.close()


def test_ctrl_c_stops_a_waiting_publisher_quietly(lonely_server, tmp_path):
    token = Cluster(lonely_server.base_url, lonely_server.admin_token, tmp_path).identity(
        f"interrupted-{tmp_path.name}", "publisher")
    events = tmp_path / "events.jsonl"
    events.write_text('{"id": "e1", "body": "hi", "values": {"symbol": "IBM", "price": 1.5, '
                      '"volume": 7}}\n')
    process = subprocess.Popen(
        cli_command("publish", "--server", lonely_server.base_url, "--advertise", "",
                    "--events", str(events)),
        env=child_env() | {"IBE_PUBSUB_TOKEN": token}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal)
    assert process.stderr is not None
    line = process.stderr.readline()
    while line and not line.startswith("waiting for the root(s)"):
        line = process.stderr.readline()
    assert process.poll() is None, line  # the control: still waiting for the roots
    assert _interrupted(process).splitlines() == ["ibe-pubsub: interrupted"]


def test_ctrl_c_stops_a_key_server_and_its_workers_quietly(tmp_path):
    data = tmp_path / "ks"
    init_keyserver(data, PASSPHRASE)
    port = free_port()
    process = subprocess.Popen(
        cli_command("keyserver", "serve", "--data", str(data), "--port", str(port),
                    "--workers", "2"),
        env=child_env(PASSPHRASE), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=_as_from_a_terminal)
    wait_ready(f"http://127.0.0.1:{port}", process)
    lines = _interrupted(process, group=True).splitlines()
    assert lines == [f"key server ready on http://127.0.0.1:{port}", "ibe-pubsub: interrupted"]


def test_a_closed_stdout_ends_a_listing_quietly(lonely_server):
    process = subprocess.Popen(
        cli_command("identity", "list", "--server", lonely_server.base_url),
        env=child_env() | {"IBE_PUBSUB_ADMIN_TOKEN": lonely_server.admin_token},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head -1` does once it has its line
    err = process.stderr.read()
    assert process.wait(timeout=60) == 128 + signal.SIGPIPE
    assert err == ""
    listed = subprocess.run(  # the control: read to the end, the same listing succeeds
        cli_command("identity", "list", "--server", lonely_server.base_url),
        env=child_env() | {"IBE_PUBSUB_ADMIN_TOKEN": lonely_server.admin_token},
        capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and listed.stdout.split()[0] == "id", listed.stderr
