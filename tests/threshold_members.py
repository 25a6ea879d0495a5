"""A threshold deployment (3 of 5) of real members on 127.0.0.1, for the tests of issuance
and of peers on such a deployment: five `keyserver serve` processes, each with its own data
directory, database, administrator and identities.

The set-up runs in the test's process (its own tests are in
keyserver/test_threshold_setup.py) and each member's outcome is written to its data
directory exactly as `keyserver threshold-setup` writes it. Then only HTTP and the CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.threshold_lab import write_local_setup
from ibe_pubsub.keyserver import MemberAccess, ThresholdKeyClient, read_public_document

t, n = 3, 5
PASSPHRASE = "threshold issuance passphrase"
GROUP = load_group()


class Deployment:
    """Five members on 127.0.0.1 and what a client needs: the public key and the URLs."""

    def __init__(self, root: Path) -> None:
        self.dirs = [root / f"member-{i}" for i in range(1, n + 1)]
        inits = [subprocess.Popen(cli_command("keyserver", "init", "--data", str(d)),
                                  env=child_env(PASSPHRASE), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for d in self.dirs]
        for p in inits:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        self.ports = [free_port() for _ in self.dirs]
        write_local_setup(GROUP, self.dirs, [self.url(i) for i in range(1, n + 1)],
                          PASSPHRASE, "acme", t)
        _, self.tpk = read_public_document(self.dirs[0] / "threshold.json", GROUP)
        self.pp = S.PublicParams(GROUP, self.tpk.mpk, default_schema())
        self.processes = {i: start_keyserver(d, port, PASSPHRASE, ["--workers", "1"],
                                             log=d / "server.log")
                          for i, (d, port) in enumerate(zip(self.dirs, self.ports,
                                                            strict=True), start=1)}
        for i, process in self.processes.items():
            wait_ready(self.url(i), process)
        self.admin = {i: (d / "admin.token").read_text().strip()
                      for i, d in enumerate(self.dirs, start=1)}

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i - 1]}"

    def register(self, name: str, role: str, at=range(1, n + 1), policy=None):
        """The identity at each of ``at`` (its own admin); its token per member."""
        tokens = {}
        for i in at:
            answer = httpx.post(self.url(i) + "/v1/admin/identities",
                                json={"name": name, "role": role, "policy": policy},
                                headers={"Authorization": f"Bearer {self.admin[i]}"})
            assert answer.status_code == 201, answer.text
            tokens[i] = answer.json()
        return tokens

    def access(self, tokens, order=None, urls=None):
        order = order or range(1, n + 1)
        return [MemberAccess(i, (urls or {}).get(i, self.url(i)),
                             tokens.get(i, {"token": "not registered here"})["token"])
                for i in order]

    def client(self, tokens, order=None, urls=None, spread=False, timeout=20, hedge=2.0):
        return ThresholdKeyClient(self.tpk, self.access(tokens, order, urls),
                                  schema=self.pp.schema, group=GROUP, spread=spread,
                                  timeout=timeout, hedge=hedge)

    def close(self) -> None:
        for process in self.processes.values():
            stop(process)


def threshold_identity(deployment, command, name, members, *extra):
    """``ibe-pubsub identity threshold-<command>`` with the admin tokens of ``members``."""
    tokens = [arg for i in members for arg in (
        "--admin-token-file", f"{i}={deployment.dirs[i - 1] / 'admin.token'}")]
    return subprocess.run(cli_command(
        "identity", f"threshold-{command}", "--deployment",
        str(deployment.dirs[0] / "threshold.json"), "--name", name, *tokens, *extra),
        env=child_env(), capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("threshold-issuance"))
    try:
        yield d
    finally:
        d.close()
