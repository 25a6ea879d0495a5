"""Fixtures that start a real key server (``keyserver init`` + ``keyserver serve`` in a child
process on a free 127.0.0.1 port). Reusable by every area's tests:

* ``keyserver`` (session): a shared server with one-hour epochs; yields
  ``KeyServer(base_url, admin_token, data_dir)`` (a named tuple).
* ``keyserver_factory``: ``start(init_args=(), serve_args=(), data_dir=None)`` starts a
  server of its own (e.g. ``init_args=("--epoch-seconds", "4", "--grace-seconds", "2")``);
  all are stopped at the end of the test. ``restart(server)`` restarts one on its data.
"""

from __future__ import annotations

import itertools
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from keyserver.launcher import free_port, init_keyserver, start_keyserver, stop, wait_ready

PASSPHRASE = "correct horse battery staple (tests)"


class KeyServer(NamedTuple):
    base_url: str
    admin_token: str
    data_dir: Path


class KeyServers:
    """Starts key servers and remembers their processes, to stop them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._names = itertools.count()

    def start(self, init_args: Sequence[str] = (), serve_args: Sequence[str] = (),
              data_dir: Path | None = None, passphrase: str = PASSPHRASE) -> KeyServer:
        if data_dir is None:
            data_dir = self.root / f"ks{next(self._names)}"
            init_keyserver(data_dir, passphrase, init_args)
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        process = start_keyserver(data_dir, port, passphrase, serve_args,
                                  log=data_dir / "server.log")
        self.processes[base_url] = process
        try:
            wait_ready(base_url, process)
        except RuntimeError as exc:
            stop(process)
            raise RuntimeError(f"{exc}:\n{(data_dir / 'server.log').read_text()}") from exc
        return KeyServer(base_url, (data_dir / "admin.token").read_text().strip(), data_dir)

    def stop(self, server: KeyServer) -> None:
        stop(self.processes.pop(server.base_url))

    def restart(self, server: KeyServer, serve_args: Sequence[str] = ()) -> KeyServer:
        self.stop(server)
        return self.start(serve_args=serve_args, data_dir=server.data_dir)

    def stop_all(self) -> None:
        for process in self.processes.values():
            stop(process)
        self.processes.clear()


@pytest.fixture(scope="session")
def keyserver() -> Iterator[KeyServer]:
    with tempfile.TemporaryDirectory(prefix="ibe-ks-") as tmp:
        servers = KeyServers(Path(tmp))
        try:
            yield servers.start()
        finally:
            servers.stop_all()


@pytest.fixture
def keyserver_factory(tmp_path: Path) -> Iterator[KeyServers]:
    servers = KeyServers(tmp_path)
    try:
        yield servers
    finally:
        servers.stop_all()


