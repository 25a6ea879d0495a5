"""Transport security of the key server and its clients, with real processes throughout:
plain HTTP is refused beyond loopback unless ``--insecure``; clients trust a private CA with
``--ca-file`` and fail in one line without it; peers trust the key server's signing key on
first use, print its fingerprint, and refuse another key later at the same URL unless
``--server-key`` pins it."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from keyserver_fixtures import PASSPHRASE
from tls_certificates import self_signed

from ibe_pubsub.cli.app import build_parser, main
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.keyserver.client import KeyServerClient

pytestmark = pytest.mark.timeout(180)


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                 float]:
    """Run ``ibe-pubsub ARGS`` to completion; returns the result and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(cli_command(*args), env=env or child_env(PASSPHRASE),
                          capture_output=True, text=True, timeout=120, check=False)
    return done, time.monotonic() - started


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The CLI's refusal: status 2, exactly one line on stderr, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("ibe-pubsub: error: "), lines[0]
    return lines[0]


def fingerprint_of(base64_key: str) -> str:
    """The SSH-style fingerprint, computed here independently of the code under test."""
    digest = hashlib.sha256(base64.b64decode(base64_key)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# -- plain HTTP beyond loopback ------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One key store for the start-up tests (unsealing it takes a scrypt run)."""
    data = tmp_path_factory.mktemp("transport") / "ks"
    init_keyserver(data, PASSPHRASE)
    return data


def test_plain_http_beyond_loopback_is_refused_before_unsealing(data_dir, tmp_path, capsys,
                                                                monkeypatch):
    serve = ("keyserver", "serve", "--data", str(data_dir), "--port", str(free_port()))
    for host in ("0.0.0.0", "::"):
        result, seconds = cli(*serve, "--host", host)
        line = one_line_error(result)
        with capsys.disabled():
            print(f"refusal for --host {host}: {seconds:.2f} s")
        assert f"refusing to serve plain HTTP on {host}" in line and "--insecure" in line
        # Fast: a CLI start-up, no scrypt unsealing, no database, no workers (which, on this
        # real key store, would have started serving and never returned).
        assert seconds < 20
    # The same command in this process, on a directory without a key store: loopback and TLS
    # pass the address check and only then fail, on the missing key store.
    monkeypatch.setenv("IBE_PUBSUB_PASSPHRASE", PASSPHRASE)
    cert, key = self_signed(tmp_path)
    empty = ("keyserver", "serve", "--data", str(tmp_path / "nothing"), "--port", "9")
    cases = {("--host", "example.org"): True, ("--host", "10.1.2.3"): True,
             ("--host", "::ffff:10.1.2.3"): True, ("--host", "127.8.9.10"): False,
             ("--host", "::ffff:127.0.0.1"): False,
             ("--host", "localhost"): False, ("--host", "::1"): False,
             ("--host", "0.0.0.0", "--tls-cert", cert, "--tls-key", key): False}
    for extra, refused in cases.items():
        assert main([*empty, *extra]) == 2
        line = capsys.readouterr().err.strip()
        assert ("refusing to serve plain HTTP" in line) == refused, (extra, line)
        assert refused or "nothing" in line, (extra, line)


def test_insecure_serves_plain_http_on_every_address_with_a_warning(data_dir):
    port = free_port()
    log = data_dir / "insecure.log"
    process = start_keyserver(data_dir, port, PASSPHRASE,
                              ("--host", "0.0.0.0", "--insecure", "--workers", "1"), log=log)
    started = time.monotonic()
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        print(f"--insecure on 0.0.0.0 ready (unsealed, migrated) in "
              f"{time.monotonic() - started:.2f} s")
        # Bound to every address: it answers on 127.0.0.2 too ...
        assert httpx.get(f"http://127.0.0.2:{port}/healthz", timeout=5).status_code == 200
    finally:
        stop(process)
    assert "serving plain HTTP on 0.0.0.0 (--insecure)" in log.read_text()
    # ... which a listener on 127.0.0.1 alone (the default) does not.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", listener.getsockname()[1]), timeout=5)


# -- a private CA ----------------------------------------------------------------------------

@dataclass
class TlsServer:
    url: str
    ca_file: str
    admin_token_file: str
    process: subprocess.Popen[bytes]


def wait_tls(url: str, ca_file: str, process: subprocess.Popen[bytes]) -> None:
    context = ssl.create_default_context(cafile=ca_file)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the TLS key server exited"
        try:
            if httpx.get(url + "/healthz", verify=context, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"TLS key server at {url} not ready")


@pytest.fixture
def tls_server(data_dir, tmp_path) -> Iterator[TlsServer]:
    """The key store served over HTTPS with a certificate from a private (self-signed) CA."""
    cert, key = self_signed(tmp_path)
    port = free_port()
    process = start_keyserver(data_dir, port, PASSPHRASE,
                              ("--tls-cert", cert, "--tls-key", key, "--workers", "1"),
                              log=tmp_path / "tls.log")
    url = f"https://127.0.0.1:{port}"
    try:
        wait_tls(url, cert, process)
        yield TlsServer(url, cert, str(data_dir / "admin.token"), process)
    finally:
        stop(process)


def test_every_key_server_client_command_takes_a_ca_file():
    parser = build_parser()
    for path in (("identity", "add"), ("identity", "list"), ("identity", "revoke"),
                 ("peer", "run"), ("publish",), ("bulk", "issue")):
        leaf = parser
        for name in path:
            sub = next(a for a in leaf._actions if isinstance(a, argparse._SubParsersAction))
            leaf = sub.choices[name]
        assert "--ca-file" in leaf._option_string_actions, path


def test_ca_file_trusts_a_private_ca_and_nothing_else(tls_server, tmp_path):
    admin = ("--server", tls_server.url, "--admin-token-file", tls_server.admin_token_file)
    trusted, seconds = cli("identity", "list", *admin, "--ca-file", tls_server.ca_file,
                           "--json")
    assert trusted.returncode == 0, trusted.stderr
    assert isinstance(json.loads(trusted.stdout), list)
    print(f"identity list over TLS with --ca-file: {seconds:.2f} s")

    untrusted, seconds = cli("identity", "list", *admin)
    line = one_line_error(untrusted)
    print(f"refusal without --ca-file: {seconds:.2f} s")
    assert "TLS certificate is not trusted" in line and "--ca-file" in line
    assert seconds < 20  # refused at once, not after connection retries

    (tmp_path / "other").mkdir()
    other_ca, _ = self_signed(tmp_path / "other")  # same name and address, another key
    assert "not trusted" in one_line_error(cli("identity", "list", *admin,
                                               "--ca-file", other_ca)[0])
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    bad = cli("identity", "list", *admin, "--ca-file", str(garbage))[0]
    assert bad.returncode == 2 and "cannot load CA certificates" in bad.stderr

    # The same option from the environment, as every option can be given.
    env = child_env(PASSPHRASE) | {"IBE_PUBSUB_CA_FILE": tls_server.ca_file}
    added = cli("identity", "add", *admin, "--name", "tls-pub", "--role", "publisher",
                env=env)[0]
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()

    # A peer command: a publisher enrols over TLS with --ca-file, and refuses without it.
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"id": "e1", "values": {"symbol": "IBM", "price": 1.0,
                                                         "volume": 1}}) + "\n")
    peer_env = child_env() | {"IBE_PUBSUB_TOKEN": token,
                              "IBE_PUBSUB_KNOWN_SERVERS": str(tmp_path / "known.json")}
    publish = ("publish", "--server", tls_server.url, "--advertise", "", "--events",
               str(events), "--root-timeout", "0")
    enrolled = cli(*publish, "--ca-file", tls_server.ca_file, env=peer_env)[0]
    # Enrolled (first contact noted) and checked the events; stops as no root peer runs.
    assert enrolled.returncode == 2 and "Traceback" not in enrolled.stderr
    first_contact, error = enrolled.stderr.strip().splitlines()
    assert "first contact" in first_contact and "no root registered" in error
    assert tls_server.url in json.loads((tmp_path / "known.json").read_text())
    refused = one_line_error(cli(*publish, env=peer_env)[0])
    assert "TLS certificate is not trusted" in refused


# -- trust on first use of the server's signing key --------------------------------------------

@dataclass
class PeerRun:
    returncode: int | None  # None: it got ready (and was stopped)
    stderr: str


def run_root_peer(url: str, token: str, tmp_path: Path, *args: str,
                  env: dict[str, str] | None = None) -> PeerRun:
    """``peer run --root symbol`` until it is ready (then SIGTERM) or exits by itself."""
    ready = tmp_path / f"ready-{time.monotonic_ns()}.json"
    err = tmp_path / f"peer-{time.monotonic_ns()}.err"
    env = (env or child_env()) | {"IBE_PUBSUB_TOKEN": token}
    with err.open("wb") as log:
        process = subprocess.Popen(cli_command(
            "peer", "run", "--server", url, "--root", "symbol", "--ready-file", str(ready),
            *args), env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    code = None if ready.exists() else process.poll()
    stop(process)
    assert code is not None or ready.exists(), "the peer neither got ready nor exited"
    return PeerRun(code, err.read_text())


class SamePortServers:
    """Key servers that take turns on one port, as an impostor replacing the real one would."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, data: Path) -> tuple[str, str]:
        """A key server on ``data`` (made if missing) on the port; its signing key and the
        token of a new root identity."""
        self.stop()
        if not data.exists():
            init_keyserver(data, PASSPHRASE)
        self.process = start_keyserver(data, self.port, PASSPHRASE, ("--workers", "1"),
                                       log=data / "same-port.log")
        wait_ready(self.url, self.process)
        with KeyServerClient(self.url, (data / "admin.token").read_text().strip()) as admin:
            token = admin.create_identity(f"root-{time.monotonic_ns()}", "root")["token"]
            return admin.params()["server_key"], token

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None


@pytest.fixture
def same_port(tmp_path) -> Iterator[SamePortServers]:
    servers = SamePortServers(tmp_path)
    try:
        yield servers
    finally:
        servers.stop()


def test_peers_trust_the_server_key_on_first_use_and_refuse_another(same_port, data_dir,
                                                                   tmp_path):
    known = tmp_path / "known_servers.json"
    flag = ("--known-servers", str(known))
    key_a, token_a = same_port.start(data_dir)

    started = time.monotonic()
    first = run_root_peer(same_port.url, token_a, tmp_path, *flag)
    print(f"root peer ready on first contact in {time.monotonic() - started:.2f} s")
    assert first.returncode is None, first.stderr
    assert "first contact" in first.stderr and fingerprint_of(key_a) in first.stderr
    assert json.loads(known.read_text()) == {same_port.url: key_a}

    again = run_root_peer(same_port.url, token_a, tmp_path, *flag)
    assert again.returncode is None, again.stderr
    assert "first contact" not in again.stderr and "SHA256:" not in again.stderr

    # Another key server takes over the URL: refused by both peer commands.
    key_b, token_b = same_port.start(tmp_path / "impostor")
    assert key_b != key_a
    refused = run_root_peer(same_port.url, token_b, tmp_path, *flag)
    assert refused.returncode == 2
    line = refused.stderr.strip().splitlines()[-1]
    assert "could not start" in line and "Traceback" not in refused.stderr
    assert fingerprint_of(key_a) in line and fingerprint_of(key_b) in line
    assert str(known) in line and "delete its entry" in line and "--server-key" in line
    events = tmp_path / "none.jsonl"
    events.write_text("")
    published = cli("publish", "--server", same_port.url, "--advertise", "", "--events",
                    str(events), *flag, env=child_env() | {"IBE_PUBSUB_TOKEN": token_b})[0]
    assert fingerprint_of(key_b) in one_line_error(published)
    assert json.loads(known.read_text()) == {same_port.url: key_a}  # record unchanged

    # --server-key decides instead of the record: the new key is accepted, the old refused.
    pinned = run_root_peer(same_port.url, token_b, tmp_path, *flag, "--server-key", key_b)
    assert pinned.returncode is None, pinned.stderr
    assert "SHA256:" not in pinned.stderr
    wrong_pin = run_root_peer(same_port.url, token_b, tmp_path, *flag, "--server-key", key_a)
    assert wrong_pin.returncode == 2 and "pinned" in wrong_pin.stderr
    assert json.loads(known.read_text()) == {same_port.url: key_a}

    # Control: the same server is accepted where nothing is recorded for the URL; without
    # flag and environment variable, the record goes to ~/.config (here a temporary home).
    env = child_env()
    env.pop("IBE_PUBSUB_KNOWN_SERVERS", None)
    env.pop("XDG_CONFIG_HOME", None)
    env["HOME"] = str(tmp_path / "home")
    fresh = run_root_peer(same_port.url, token_b, tmp_path, env=env)
    assert fresh.returncode is None and fingerprint_of(key_b) in fresh.stderr
    recorded = tmp_path / "home" / ".config" / "ibe-pubsub" / "known_servers.json"
    assert json.loads(recorded.read_text()) == {same_port.url: key_b}
