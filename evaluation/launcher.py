"""Starting a key server in a child process (benchmarks, tests, demos) and waiting for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from ibe_pubsub.evaluation.exceptions import BenchRunError
from ibe_pubsub.peer import WaitAnnouncer


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command(*args: str) -> list[str]:
    """``ibe-pubsub ARGS`` run by this interpreter (the same installation as the caller's)."""
    return [sys.executable, "-m", "ibe_pubsub.cli", *args]


def child_env(passphrase: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if passphrase is not None:
        env["IBE_PUBSUB_PASSPHRASE"] = passphrase
    return env


def init_keyserver(data_dir: Path, passphrase: str, extra: Sequence[str] = ()) -> None:
    """Run ``keyserver init`` in a child process; raises with its stderr on failure."""
    done = subprocess.run(cli_command("keyserver", "init", "--data", str(data_dir), *extra),
                          env=child_env(passphrase), capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        raise BenchRunError(f"keyserver init failed: {done.stderr.strip()}")


def _serve_command(data_dir: Path, port: int, extra: Sequence[str],
                   host: str = "127.0.0.1") -> list[str]:
    return cli_command("keyserver", "serve", "--data", str(data_dir), "--host", host,
                       "--port", str(port), *extra)


def serve_expecting_exit(data_dir: Path, passphrase: str, extra: Sequence[str] = (),
                         timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``keyserver serve`` run to its end, for start-ups that must be refused: its status
    and output (``subprocess.TimeoutExpired`` if it started serving instead)."""
    return subprocess.run(_serve_command(data_dir, free_port(), extra), env=child_env(passphrase),
                          capture_output=True, text=True, timeout=timeout, check=False)


def start_keyserver(data_dir: Path, port: int, passphrase: str, extra: Sequence[str] = (),
                    log: Path | None = None, prefix: Sequence[str] = (),
                    host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    """``keyserver serve`` on ``host``:``port`` in a child process (not yet ready), run
    through ``prefix`` if given (e.g. ``taskset -c 0``)."""
    command = [*prefix, *_serve_command(data_dir, port, extra, host)]
    if log is None:
        return subprocess.Popen(command, env=child_env(passphrase), stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT)
    # The log may sit in the data directory, whose files the server insists are 0600.
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(command, env=child_env(passphrase), stdout=out,
                                stderr=subprocess.STDOUT)
    finally:
        os.close(out)


def wait_ready(base_url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Poll /healthz until it answers; raise if the process exits or time runs out."""
    announcer = WaitAnnouncer(f"the key server at {base_url} to answer", limit=timeout)
    while not announcer.expired:
        announcer.tick()
        if process.poll() is not None:
            raise BenchRunError(f"key server exited with status {process.returncode}")
        try:
            if httpx.get(base_url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise BenchRunError(f"key server at {base_url} not ready after {timeout} s")


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
