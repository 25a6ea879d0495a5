"""The container files checked without a Docker engine: the Dockerfile copies and installs
what the package needs, .dockerignore lets it through, compose.yaml's references agree; and
the image's own commands (its architecture check, its default `keyserver serve` under its
ENV, its HEALTHCHECK) run here as the image runs them, against real key servers."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import ssl
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from keyserver_fixtures import PASSPHRASE
from repository import REPO_ROOT
from sqlalchemy.engine import make_url
from tls_certificates import self_signed

from ibe_pubsub.cli.app import build_parser, main
from ibe_pubsub.evaluation.launcher import child_env, cli_command, free_port, init_keyserver, stop
from ibe_pubsub.keyserver.healthcheck import probe_url, runs_keyserver

pytestmark = pytest.mark.timeout(180)


def dockerfile() -> list[tuple[str, str, str]]:
    """(stage, INSTRUCTION, arguments) of each instruction, continuation lines joined."""
    text = (REPO_ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stage, found = "", []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stage = rest.split()[-1]
        found.append((stage, word.upper(), rest.strip()))
    return found


def image_environment() -> dict[str, str]:
    return dict(item.split("=", 1) for _, word, rest in dockerfile() if word == "ENV"
                for item in shlex.split(rest))


def exec_form(word: str) -> list[str]:
    rest = next(rest for _, w, rest in dockerfile() if w == word)
    return json.loads(rest[rest.index("["):])


# -- Dockerfile, .dockerignore -------------------------------------------------------------------

def test_dockerfile_copies_every_package_and_dockerignore_lets_them_through():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = set(project["tool"]["setuptools"]["package-dir"].values())
    needed = packages | {"pyproject.toml", project["project"]["readme"],
                         *project["project"]["license-files"]}
    copied = {source for _, word, rest in dockerfile() if word == "COPY" and "--from" not in rest
              for source in rest.split()[:-1]}
    assert copied == needed
    # The allowlist sends exactly these; anything else (.env, .venv, data) stays out.
    allowed = {line[1:].rstrip("/") for line in (REPO_ROOT / ".dockerignore").read_text()
               .splitlines() if line.startswith("!")}
    assert allowed == needed
    assert "*" in (REPO_ROOT / ".dockerignore").read_text().splitlines()


def test_targets_install_what_their_commands_need():
    steps = dockerfile()
    stages = [rest.split()[-1] for _, word, rest in steps if word == "FROM"]
    assert stages[-1] == "default"  # what `docker build` without --target makes

    def installs(stage: str) -> str:
        return " ".join(rest for s, word, rest in steps if s == stage and word == "RUN")

    assert "'ibe-pubsub[postgres]'" in installs("default")
    assert "'ibe-pubsub[postgres,spark]'" in installs("bulk")
    assert "openjdk-17-jre-headless" in installs("bulk")
    assert "openjdk" not in installs("default") and "spark" not in installs("default")
    for stage in ("default", "bulk"):
        assert [rest for s, word, rest in steps if s == stage and word == "USER"] == ["ibe"]


def test_the_user_home_is_made_and_outside_the_data_volume():
    """A peer run in the container writes ~/.config and ~/.local/state: in /data they
    would open the key server's directory to other users, and `serve` would refuse it."""
    useradd = next(shlex.split(rest.split("&&")[0]) for _, word, rest in dockerfile()
                   if word == "RUN" and rest.startswith("useradd"))
    home = Path(useradd[useradd.index("--home-dir") + 1])
    volume = Path(json.loads(next(rest for _, w, rest in dockerfile() if w == "VOLUME"))[0])
    assert "--create-home" in useradd and home.is_absolute()
    assert home != volume and volume not in home.parents
    assert "HOME" not in image_environment()  # Docker takes it from the user's entry


def test_architecture_check_refuses_all_but_amd64_before_any_wheel():
    steps = dockerfile()
    check = next(i for i, (_, word, rest) in enumerate(steps)
                 if word == "RUN" and "TARGETARCH" in rest)
    first_wheel = next(i for i, (_, word, rest) in enumerate(steps)
                       if word == "RUN" and "pip wheel" in rest)
    assert steps[check][0] == steps[first_wheel][0] == "wheels" and check < first_wheel
    script = steps[check][2]

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", script], env={"PATH": os.environ["PATH"], **env},
                              capture_output=True, text=True, timeout=30, check=False)

    for arch in ("arm64", "aarch64", "riscv64"):
        refused = run(TARGETARCH=arch)
        assert refused.returncode == 1
        assert "pymcl" in refused.stderr and arch in refused.stderr
        assert "--platform linux/amd64" in refused.stderr
    assert run(TARGETARCH="amd64").returncode == 0  # the control
    # Without BuildKit's TARGETARCH it asks the machine.
    assert run().returncode == (0 if platform.machine() == "x86_64" else 1)


def subcommand(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = choices.choices[name]
    return parser


def test_image_environment_configures_keyserver_serve():
    """The ENV the image sets must be options `keyserver serve` reads, and its CMD and
    HEALTHCHECK must name what exists."""
    options = {action.dest for action in subcommand("keyserver", "serve")._actions}
    names = {k.removeprefix("IBE_PUBSUB_").lower() for k in image_environment()
             if k.startswith("IBE_PUBSUB_")}
    assert names == {"data", "host", "port", "tls_cert", "tls_key"} <= options
    assert exec_form("ENTRYPOINT") == ["ibe-pubsub"]
    assert exec_form("CMD") == ["keyserver", "serve"]
    assert exec_form("HEALTHCHECK") == ["python", "-I", "-m", "ibe_pubsub.keyserver.healthcheck"]


# -- compose.yaml ----------------------------------------------------------------------------

def test_compose_references_are_consistent():
    compose = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
    services, volumes = compose["services"], compose["volumes"]
    assert set(services) == {"keyserver", "db"}
    keyserver, db = services["keyserver"], services["db"]
    used = {entry.split(":", 1)[0] for s in services.values() for entry in s.get("volumes", [])}
    assert used == set(volumes)
    assert "keyserver-data:/data" in keyserver["volumes"]
    assert keyserver["build"] == "." and db["image"] == "postgres:16"
    assert keyserver["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert db["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    # The key server reaches the database service by name, as the user the image creates,
    # with the password libpq takes from PGPASSWORD: the same variable as the database's.
    url = make_url(keyserver["environment"]["IBE_PUBSUB_DATABASE_URL"])
    assert url.drivername == "postgresql+psycopg" and url.host in services
    assert url.password is None
    assert (url.username, url.database) == (db["environment"]["POSTGRES_USER"],
                                            db["environment"]["POSTGRES_DB"])
    assert (keyserver["environment"]["PGPASSWORD"] == db["environment"]["POSTGRES_PASSWORD"]
            and db["environment"]["POSTGRES_PASSWORD"].startswith("${DB_PASSWORD:?"))
    assert keyserver["environment"]["IBE_PUBSUB_PASSPHRASE"].startswith(
        "${IBE_PUBSUB_PASSPHRASE:?")
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    assert "DB_PASSWORD=" in operations and "IBE_PUBSUB_PASSPHRASE=" in operations


# -- the image's commands, run here ------------------------------------------------------------

def test_healthcheck_finds_only_key_servers():
    assert runs_keyserver([["python", "-m", "ibe_pubsub.cli", "keyserver", "serve", "--data", "d"]])
    assert runs_keyserver([["/usr/local/bin/ibe-pubsub", "-v", "keyserver", "-v", "serve"]])
    assert not runs_keyserver([["ibe-pubsub", "peer", "run", "--root", "serve"]])
    assert not runs_keyserver([["python", "-I", "-m", "ibe_pubsub.keyserver.healthcheck"], []])
    assert probe_url({}) == "http://127.0.0.1:8700/healthz"
    assert probe_url({"IBE_PUBSUB_HOST": "::", "IBE_PUBSUB_PORT": "9",
                      "IBE_PUBSUB_TLS_CERT": "c"}) == "https://127.0.0.1:9/healthz"
    assert probe_url({"IBE_PUBSUB_HOST": "::1"}) == "http://[::1]:8700/healthz"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A key store laid out as in the image's volume, TLS files in DIR/tls."""
    data = tmp_path_factory.mktemp("image") / "data"
    init_keyserver(data, PASSPHRASE)
    return data


def environment(data: Path, port: int, **extra: str) -> dict[str, str]:
    """The image's ENV with its /data moved to ``data``, on ``port``."""
    env = {k: v.replace("/data", str(data)) for k, v in image_environment().items()}
    return child_env(PASSPHRASE) | env | {"IBE_PUBSUB_PORT": str(port)} | extra


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK command, this interpreter standing for the image's python."""
    return subprocess.run([sys.executable, *exec_form("HEALTHCHECK")[1:]], env=env,
                          capture_output=True, text=True, timeout=30, check=False)


Start = Callable[..., tuple[dict[str, str], str]]


@pytest.fixture
def served(data_dir: Path, tmp_path: Path) -> Iterator[Start]:
    """Starts the image's default command, `keyserver serve` configured by its ENV alone
    (and ``extra`` variables); returns that environment and the URL the probe uses."""

    def start(**extra: str) -> tuple[dict[str, str], str]:
        env = environment(data_dir, free_port(), **extra)
        with (tmp_path / "serve.log").open("ab") as log:
            processes.append(subprocess.Popen(cli_command(*exec_form("CMD")), env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
        return env, probe_url(env)

    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield start
    finally:
        for process in processes:
            stop(process)


def wait_healthy(url: str, verify: ssl.SSLContext | bool) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, verify=verify, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"{url} did not answer"
            time.sleep(0.1)


def test_default_command_needs_tls_files_then_serves_and_is_healthy(data_dir, served,
                                                                    tmp_path, monkeypatch,
                                                                    capsys):
    def refusal(**extra: str) -> str:
        """The default command run in this process under the image's ENV: its one line."""
        for name, value in (environment(data_dir, free_port()) | extra).items():
            monkeypatch.setenv(name, value)
        assert main(exec_form("CMD")) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ibe-pubsub: error: "), lines
        return lines[0]

    tls = data_dir / "tls"
    # Before the TLS files are in the volume: one line naming the file, before unsealing.
    assert f"--tls-cert {tls / 'cert.pem'}: no such file" in refusal()
    tls.mkdir(mode=0o700)
    cert, key = self_signed(tls)
    _, foreign_key = self_signed(tmp_path)
    mismatched = refusal(IBE_PUBSUB_TLS_KEY=foreign_key)
    assert f"cannot use --tls-cert {cert} with --tls-key {foreign_key}" in mismatched
    for path in (cert, key):  # as the documented `install -m 600` leaves them
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)

    env, url = served()
    assert url.startswith("https://127.0.0.1:")  # 0.0.0.0 probed on loopback, over TLS
    wait_healthy(url, ssl.create_default_context(cafile=cert))
    assert healthcheck(env).returncode == 0
    # Negative cases, each against this running server: another port; plain HTTP.
    elsewhere = healthcheck(env | {"IBE_PUBSUB_PORT": str(free_port())})
    assert elsewhere.returncode == 1 and elsewhere.stderr.startswith("unhealthy: https://")
    plain = healthcheck(env | {"IBE_PUBSUB_TLS_CERT": ""})
    assert plain.returncode == 1 and plain.stderr.startswith("unhealthy: http://")


def test_behind_a_tls_proxy_the_image_serves_plain_http_and_is_healthy(data_dir, served):
    env, url = served(IBE_PUBSUB_TLS_CERT="", IBE_PUBSUB_TLS_KEY="", IBE_PUBSUB_INSECURE="1")
    assert url.startswith("http://127.0.0.1:")
    wait_healthy(url, verify=True)
    assert healthcheck(env).returncode == 0
