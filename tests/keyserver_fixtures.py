"""Fixtures that start a real key server (``keyserver init`` + ``keyserver serve`` in a child
process on a free 127.0.0.1 port). Reusable by every area's tests:

* ``keyserver`` (session): a shared server with one-hour epochs; yields
  ``KeyServer(base_url, admin_token, data_dir)`` (a named tuple).
* ``keyserver_factory``: ``start(init_args=(), serve_args=(), data_dir=None)`` starts a
  server of its own (e.g. ``init_args=("--epoch-seconds", "4", "--grace-seconds", "2")``);
  all are stopped at the end of the test. ``restart(server)`` restarts one on its data
  (on a new port, or on its own with ``same_port=True``).
* ``postgres_url`` (session): a throwaway PostgreSQL cluster (skips if none can start).

Helpers: ``bearer_client`` (an httpx client carrying a token) and ``rss_mib`` (a process's
resident memory, for the tests that flood a server).
"""

from __future__ import annotations

import itertools
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess
from ibe_pubsub.evaluation.launcher import (
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.postgres import PostgresUnavailable, throwaway_postgres

PASSPHRASE = "correct horse battery staple (tests)"


def bearer_client(base_url: str, token: str, timeout: float = 60) -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=timeout,
                        headers={"Authorization": f"Bearer {token}"})


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


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
              data_dir: Path | None = None, passphrase: str = PASSPHRASE,
              port: int | None = None) -> KeyServer:
        if data_dir is None:
            data_dir = self.root / f"ks{next(self._names)}"
            init_keyserver(data_dir, passphrase, init_args)
        port = port or free_port()
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

    def restart(self, server: KeyServer, serve_args: Sequence[str] = (),
                same_port: bool = False) -> KeyServer:
        self.stop(server)
        port = int(server.base_url.rsplit(":", 1)[1]) if same_port else None
        return self.start(serve_args=serve_args, data_dir=server.data_dir, port=port)

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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free port; the URL of its ``postgres`` database.
    Skips (with the reason) where PostgreSQL is not installed or cannot start."""
    try:
        with throwaway_postgres() as url:
            yield url
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))


@contextmanager
def rooted_cluster(work: Path, init_args: Sequence[str] = (), peer_args: tuple[str, ...] = ()
                   ) -> Iterator[tuple[KeyServer, Cluster, PeerProcess]]:
    """A key server in ``work``, a cluster of peers around it and one root of the stock
    schema's three trees, ready; every process is stopped on the way out."""
    servers = KeyServers(work)
    try:
        server = servers.start(init_args=init_args)
        cluster = Cluster(server.base_url, server.admin_token, work / "peers",
                          peer_args=peer_args)
        try:
            root = cluster.start_root("root", ["symbol", "price", "volume"])
            cluster.wait_ready([root])
            yield server, cluster, root
        finally:
            cluster.stop_all()
    finally:
        servers.stop_all()
