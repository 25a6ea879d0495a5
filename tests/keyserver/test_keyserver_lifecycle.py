"""Key server lifecycle with real processes: init, restart, passphrase, epochs, rate limits, CLI."""

from __future__ import annotations

import json
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from keyserver_fixtures import PASSPHRASE
from tls_certificates import self_signed

from ibe_pubsub.cli.app import main
from ibe_pubsub.evaluation.launcher import child_env, cli_command, free_port, start_keyserver, stop
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError


def _run(*args: str, passphrase: str | None = PASSPHRASE) -> subprocess.CompletedProcess[str]:
    env = child_env(passphrase)
    if passphrase is None:
        env.pop("IBE_PUBSUB_PASSPHRASE", None)
    return subprocess.run(cli_command(*args), env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_init_keeps_secrets_private_and_refuses_to_overwrite(tmp_path):
    data = tmp_path / "ks"
    assert _run("keyserver", "init", "--data", str(data), passphrase=None).returncode == 2
    done = _run("keyserver", "init", "--data", str(data), "--epoch-seconds", "60")
    assert done.returncode == 0, done.stderr
    for name in ("master.sealed", "admin.token"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600
    sealed = (data / "master.sealed").read_bytes()
    again = _run("keyserver", "init", "--data", str(data))
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    assert (data / "master.sealed").read_bytes() == sealed
    bad = _run("keyserver", "init", "--data", str(tmp_path / "x"), "--epoch-seconds", "100",
               "--grace-seconds", "99")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "between 0 and half the epoch length (50 s" in bad.stderr
    assert not (tmp_path / "x").exists()


def test_restart_keeps_keys_identities_epochs_and_audit_and_needs_the_passphrase(
        keyserver_factory):
    server = keyserver_factory.start(serve_args=("--workers", "1"))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    created = admin.create_identity("survivor", "publisher")
    KeyServerClient(server.base_url, created["token"]).enrol_publisher("price < 10")
    before = (KeyServerClient(server.base_url).params(), admin.audit(limit=1000))
    keyserver_factory.stop(server)

    wrong = _run("keyserver", "serve", "--data", str(server.data_dir), "--port",
                 str(free_port()), passphrase="not the passphrase")
    assert wrong.returncode == 2
    assert "wrong passphrase" in wrong.stderr and "IBE_PUBSUB_PASSPHRASE" in wrong.stderr

    server = keyserver_factory.start(serve_args=("--workers", "1"), data_dir=server.data_dir)
    params = KeyServerClient(server.base_url).params()
    for field in ("mpk", "server_key", "schema_signature", "epoch", "epoch_start"):
        assert params[field] == before[0][field]
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    assert admin.audit(limit=1000)[:len(before[1])] == before[1]
    again = KeyServerClient(server.base_url, created["token"]).enrol_publisher("price < 10")
    assert again["epoch"] == before[0]["epoch"]
    assert [i["name"] for i in admin.list_identities()] == ["survivor"]


def _wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def _enrol_now_and_next_in_one_grace_window(public, client, attempts: int = 3):
    """Both enrolments inside one grace window; a loaded machine may cross the epoch
    boundary between them, so try again in the next window rather than race the clock."""
    issued = 0
    for _ in range(attempts):
        _wait_until(lambda: public.epoch()["in_grace"], 20)
        current = public.epoch()
        now_keys = client.enrol_subscriber("price < 5", fine_depth=0)
        issued += 1
        try:
            next_keys = client.enrol_subscriber("price < 5", fine_depth=0, epoch="next")
        except KeyServerRequestError as error:
            assert error.status == 409 and public.epoch()["epoch"] > current["epoch"], error
            continue
        issued += 1
        if now_keys["epoch"] == current["epoch"]:
            return current, next_keys, issued
    raise AssertionError(f"no grace window held two enrolments in {attempts} tries")


def test_epochs_roll_over_with_grace_and_revocation_stops_issuance(keyserver_factory):
    server = keyserver_factory.start(init_args=("--epoch-seconds", "8", "--grace-seconds", "4"),
                                     serve_args=("--workers", "1"))
    public = KeyServerClient(server.base_url)
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    created = admin.create_identity("shortlived", "subscriber")
    client = KeyServerClient(server.base_url, created["token"], retries=0)

    current, next_keys, issued_count = _enrol_now_and_next_in_one_grace_window(
        public, client)
    assert next_keys["epoch"] == current["epoch"] + 1
    assert next_keys["epoch_end"] == pytest.approx(current["epoch_end"] + 8)

    admin.revoke(created["id"])
    _wait_until(lambda: public.epoch()["epoch"] > current["epoch"], 10)
    with pytest.raises(KeyServerRequestError) as info:
        client.enrol_subscriber("price < 5", fine_depth=0)
    assert info.value.status == 403
    issued = [e["epoch"] for e in admin.audit(limit=1000) if e["action"] == "issue_subscriber"]
    assert len(issued) == issued_count
    assert issued[-2:] == [current["epoch"], current["epoch"] + 1]


def test_rate_limits_answer_429_with_retry_after(keyserver_factory):
    server = keyserver_factory.start(serve_args=("--rate", "0.5", "--burst", "2", "--workers", "1"))
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    answers = [httpx.get(server.base_url + "/v1/admin/identities", headers=headers)
               for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert int(answers[2].headers["Retry-After"]) >= 1
    assert answers[2].json()["error"]["code"] == "rate_limited"


def test_identity_cli_adds_lists_and_revokes(keyserver):
    common = ("--server", keyserver.base_url, "--admin-token-file",
              str(keyserver.data_dir / "admin.token"))
    added = _run("identity", "add", *common, "--name", "cli-user", "--role", "subscriber",
                 "--allow", "price < 50")
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    KeyServerClient(keyserver.base_url, token).enrol_subscriber("price < 10", fine_depth=0)
    listed = _run("identity", "list", *common)
    assert "cli-user" in listed.stdout and "price < 50.0" in listed.stdout
    assert _run("identity", "revoke", *common, "--name", "cli-user").returncode == 0
    with pytest.raises(KeyServerRequestError):
        KeyServerClient(keyserver.base_url, token, retries=0).enrol_subscriber("price < 10")
    dup = _run("identity", "add", *common, "--name", "cli-user", "--role", "subscriber")
    assert dup.returncode == 2 and "409" in dup.stderr
    assert _run("identity", "revoke", *common, "--name", "nobody").returncode == 2


def test_bench_keyserver_smoke(tmp_path):
    out = tmp_path / "ks.json"
    done = _run("bench", "keyserver", "--json", str(out), "--seconds", "1", "--clients", "2",
                "--workers", "1", "--max-credentials", "1", "--no-plot")
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["enrolments_http"] >= 1 and summary["floor_keys_per_second"] > 0
    assert summary["ratio"] == pytest.approx(
        summary["http_keys_per_second"] / summary["floor_keys_per_second"], rel=0.01)


def test_serves_tls_when_given_a_certificate(tmp_path):
    data = tmp_path / "ks"
    assert _run("keyserver", "init", "--data", str(data)).returncode == 0
    cert, key = self_signed(tmp_path)
    port = free_port()
    process = start_keyserver(data, port, PASSPHRASE,
                              ("--tls-cert", cert, "--tls-key", key, "--workers", "1"))
    try:
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            # Clients closed at once: an open connection holds up the server's shutdown.
            try:
                with KeyServerClient(url, verify=cert, retries=0) as client:
                    assert client.health()["status"] == "ok"
                break
            except KeyServerRequestError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        # an unverified certificate is refused
        with KeyServerClient(url, retries=0) as client, pytest.raises(KeyServerRequestError):
            client.health()
    finally:
        stop(process)


def test_rotate_admin_token_takes_effect_at_restart(keyserver_factory, tmp_path, monkeypatch,
                                                   capsys):
    server = keyserver_factory.start(serve_args=("--workers", "1"))
    token_file = server.data_dir / "admin.token"
    old = server.admin_token

    def status(base_url: str, token: str) -> int:
        return httpx.get(base_url + "/v1/admin/identities", timeout=30,
                         headers={"Authorization": f"Bearer {token}"}).status_code

    def rotate(data_dir: Path) -> tuple[int, str]:
        capsys.readouterr()  # only what this command prints
        code = main(["keyserver", "rotate-admin-token", "--data", str(data_dir)])
        return code, capsys.readouterr().err.strip()

    monkeypatch.delenv("IBE_PUBSUB_PASSPHRASE", raising=False)  # it needs none
    code, message = rotate(server.data_dir)
    assert code == 0 and "restart" in message and str(token_file) in message
    new = token_file.read_text().strip()
    assert new != old and len(new) >= 40
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert sorted(p.name for p in server.data_dir.iterdir() if "admin" in p.name) == [
        "admin.token"]  # no staging file left behind
    # The running server keeps the token it read at start ...
    assert (status(server.base_url, old), status(server.base_url, new)) == (200, 401)
    # ... and after a restart only the new one works.
    server = keyserver_factory.restart(server, serve_args=("--workers", "1"))
    assert server.admin_token == new
    assert (status(server.base_url, old), status(server.base_url, new)) == (401, 200)

    code, message = rotate(tmp_path / "none")
    assert code == 2 and message.startswith("ibe-pubsub: error: no key store in")
    assert len(message.splitlines()) == 1 and not (tmp_path / "none").exists()
