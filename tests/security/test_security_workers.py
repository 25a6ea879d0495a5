"""Issuer workers hold the master secret, so they must not outlive a key server killed with
SIGKILL (which cannot shut its pool down): every child of the server is gone within 5 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

EXIT_LIMIT_SECONDS = 5.0


def _stat_fields(pid: int) -> list[str] | None:
    """``state ppid ...`` of /proc/PID/stat (after the command name, which may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        fields = _stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie left for a reaper that does not reap holds no memory: gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def seconds_until_gone(pids: Iterable[int], limit: float) -> float | None:
    """How long until none of ``pids`` runs, polled every 50 ms; None if still after ``limit``."""
    start = time.monotonic()
    while time.monotonic() - start <= limit:
        if not any(alive(pid) for pid in pids):
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def test_issuer_workers_exit_within_5_s_of_the_servers_kill_9(keyserver_factory):
    server = keyserver_factory.start(serve_args=("--workers", "2"))
    process = keyserver_factory.processes[server.base_url]
    spawned = children(process.pid)
    workers = [pid for pid in spawned if "spawn_main" in command_line(pid)]
    print(f"server {process.pid}: children {spawned}, issuer workers {workers}")
    # control: the workers run, as children of the server, before the kill
    assert workers and all(alive(pid) for pid in workers)
    process.send_signal(signal.SIGKILL)
    process.wait()
    gone_after = seconds_until_gone(spawned, EXIT_LIMIT_SECONDS)
    left = [(pid, command_line(pid)) for pid in spawned if alive(pid)]
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    print(f"all children of the killed server gone after {gone_after} s")
    assert gone_after is not None, f"still running {EXIT_LIMIT_SECONDS} s after the kill: {left}"


CONTROL_SCRIPT = """
import concurrent.futures, multiprocessing, os, time
pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
print(pool.submit(os.getpid).result(), flush=True)
time.sleep(120)
"""


def test_control_a_plain_spawn_pool_worker_outlives_its_killed_parent():
    """The flaw is real and the probe sees it: without the issuer's parent watch a spawned
    pool worker is still running when the limit has passed."""
    parent = subprocess.Popen([sys.executable, "-c", CONTROL_SCRIPT], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert worker in children(parent.pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    try:
        assert seconds_until_gone([worker], EXIT_LIMIT_SECONDS) is None
    finally:
        os.kill(worker, signal.SIGKILL)
