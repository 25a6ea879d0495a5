"""Real Spark servers on 127.0.0.1 for the cluster tests: a standalone master with two
workers, and a Spark Connect server, each a JVM of the pyspark wheel's own Spark.

Their Python workers run a Python that cannot import this project: ``isolated_python``
writes a wrapper that starts the test's interpreter with ``-S`` (so the site-packages
``.pth`` files, among them the editable install's finder, are not run) and gets
pyspark, pyarrow and pandas from ``PYTHONPATH`` = the site-packages directory alone. The
servers run in a directory of their own, so nothing of the project's checkout is on their
path either; what our code their workers run must come from the zip the driver ships. The
wrapper logs each start, which shows the workers really ran it.

Each JVM is the leader of a process group of its own (executors and Python workers are in
it too), and ``stop_all`` ends the whole group: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from ibe_pubsub.evaluation.launcher import free_port

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT = 90.0


def isolated_python(directory: Path, interpreter: str) -> Path:
    """A wrapper for ``PYSPARK_PYTHON``: ``interpreter -S``, each start logged to
    ``directory/python-starts.log``."""
    wrapper = directory / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$$ $*" >> "{directory / "python-starts.log"}"\n'
                       f'exec "{interpreter}" -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def server_env(python: Path, directory: Path) -> dict[str, str]:
    """The environment of a Spark server: the isolated Python for its workers, and no
    variable of ours or pointing at the project."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("IBE_PUBSUB_", "PYSPARK_", "SPARK_", "PYTHON"))}
    return env | {"PYSPARK_PYTHON": str(python), "PYTHONPATH": sysconfig.get_paths()["purelib"],
                  "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                  "SPARK_LOG_DIR": str(directory / "logs"), "SPARK_PID_DIR": str(directory)}


@dataclass
class Servers:
    """JVMs started in ``directory`` (its logs as NAME.log), stopped together."""

    directory: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, command: list[str]) -> None:
        with (self.directory / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                command, cwd=self.directory, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` until it holds; fail with the logs' tails if a JVM exits first or
        it takes too long."""
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            exited = [n for n, p in self.processes.items() if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}.log:\n{self.log(n)[-3000:]}" for n in self.processes)
                problem = f"{', '.join(exited)} exited" if exited else "timed out"
                raise RuntimeError(f"waiting for {what}: {problem}\n{tails}")
            time.sleep(0.3)

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            _signal_group(process, signal.SIGKILL)  # also executors that outlived their JVM
            process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def spark_class(main_class: str, *args: str) -> list[str]:
    return [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args]


@dataclass
class Standalone:
    """A standalone master and its workers: the master's URL, its web UI's, each worker's
    work directory."""

    url: str
    web_url: str
    work_dirs: list[Path]

    def state(self) -> dict:
        """The master's state as its web UI's JSON (workers, running and completed apps)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as answer:
            return json.load(answer)


def distinct_free_ports(count: int) -> list[int]:
    """``count`` ports free a moment ago, all different: held together while chosen. Chosen
    one by one, a worker's web UI could take the master's port before the master binds it,
    and the master's UI would move to the next port, where nobody looks."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def start_standalone(servers: Servers, workers: int = 2) -> Standalone:
    """A master and ``workers`` workers of one core and 1 GiB each, in separate JVMs with
    work directories of their own; returns once every worker has registered."""
    port, web_port, *worker_ports = distinct_free_ports(2 + workers)
    cluster = Standalone(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}",
                         [servers.directory / f"worker{k}" for k in range(workers)])
    servers.start("master", spark_class(MASTER_CLASS, "--host", "127.0.0.1", "--port",
                                        str(port), "--webui-port", str(web_port)))
    for k, work_dir in enumerate(cluster.work_dirs):
        work_dir.mkdir()
        servers.start(f"worker{k}", spark_class(
            WORKER_CLASS, cluster.url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--work-dir", str(work_dir), "--webui-port", str(worker_ports[k])))

    def registered() -> bool:
        try:
            return cluster.state()["aliveworkers"] == workers
        except (OSError, ValueError):  # not up yet; or up, still answering /json/ with HTML
            return False

    servers.wait_for(f"{workers} workers to register", registered)
    return cluster


def launch_connect(servers: Servers) -> str:
    """Start a Spark Connect server running the jobs on ``local[2]`` inside it, in the
    foreground (``--wait``); returns its ``sc://`` URL, which answers after
    ``wait_connect``."""
    port = free_port()
    servers.start("connect", [
        str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", "spark.ui.enabled=false"])
    return f"sc://127.0.0.1:{port}"


def wait_connect(servers: Servers) -> None:
    servers.wait_for("the Spark Connect server", lambda: "Spark Connect server started at"
                     in servers.log("connect"))
