"""The data directory stays private whatever the umask: the directory 0700, every file in it
0600 (SQLite's -wal/-shm included), and `serve` refuses a directory group or others can
reach unless started with --allow-unsafe-permissions."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from keyserver_fixtures import PASSPHRASE, KeyServers

from ibe_pubsub.evaluation.launcher import init_keyserver, serve_expecting_exit
from ibe_pubsub.keyserver.client import KeyServerClient

EXPECTED_FILES = {"master.sealed", "public.json", "admin.token", "database.json",
                  "keyserver.db", "keyserver.db-wal", "keyserver.db-shm", "server.log"}


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """Children started inside inherit ``mask``, as from an operator's shell."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, int]]]:
    """A data directory after init and serve (with writes) under umask 022, stopped again;
    with the modes seen while the server ran."""
    servers = KeyServers(tmp_path_factory.mktemp("files"))
    try:
        with umask(0o022):
            server = servers.start(serve_args=("--workers", "1"))
        with KeyServerClient(server.base_url, server.admin_token, retries=0) as admin:
            admin.create_identity("files-probe", "subscriber")
        modes = {p.name: _mode(p) for p in server.data_dir.iterdir()}
        modes["."] = _mode(server.data_dir)
    finally:
        servers.stop_all()
    yield server.data_dir, modes


def test_init_and_serve_leave_only_private_files_under_umask_022(served, tmp_path):
    _, modes = served
    print("modes:", {name: f"{mode:04o}" for name, mode in sorted(modes.items())})
    assert set(modes) == EXPECTED_FILES | {"."}
    assert modes.pop(".") == 0o700
    assert all(mode == 0o600 for mode in modes.values()), modes
    with umask(0o022):  # control: this umask alone would have left the files open to all
        (tmp_path / "probe").write_text("x")
    assert _mode(tmp_path / "probe") == 0o644


@pytest.mark.parametrize(("name", "mode"), [
    ("keyserver.db", 0o644), ("admin.token", 0o640), ("master.sealed", 0o604), (".", 0o755)])
def test_serve_refuses_a_data_directory_open_to_others(served, tmp_path, name, mode):
    data = Path(shutil.copytree(served[0], tmp_path / "ks"))
    (data / name).chmod(mode)
    done = serve_expecting_exit(data, PASSPHRASE, ("--workers", "1"), timeout=90)
    print(done.stderr.strip())
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr
    target = data if name == "." else data / name
    assert f"{target} is open to group/other users (mode {mode:04o})" in lines[0]
    assert f"chmod -R go= {data}" in lines[0] and "--allow-unsafe-permissions" in lines[0]


def test_the_override_flag_starts_on_unsafe_permissions_with_a_warning(served, tmp_path,
                                                                       keyserver_factory):
    data = Path(shutil.copytree(served[0], tmp_path / "ks"))
    (data / "keyserver.db").chmod(0o644)
    server = keyserver_factory.start(
        data_dir=data, serve_args=("--workers", "1", "--allow-unsafe-permissions"))
    log = (data / "server.log").read_text()
    assert f"{data / 'keyserver.db'} is open to group/other users" in log
    keyserver_factory.stop(server)
    # control: the same directory made private again starts without the flag
    (data / "keyserver.db").chmod(0o600)
    for path in data.glob("keyserver.db-*"):
        path.chmod(0o600)
    keyserver_factory.start(data_dir=data, serve_args=("--workers", "1"))


def test_init_tightens_an_empty_directory_but_never_a_shared_one(tmp_path):
    empty, shared = tmp_path / "empty", tmp_path / "shared"
    for path in (empty, shared):
        path.mkdir()
        path.chmod(0o755)
    (shared / "notes.txt").write_text("someone else's")
    (shared / "notes.txt").chmod(0o644)
    init_keyserver(empty, PASSPHRASE)
    assert _mode(empty) == 0o700
    with pytest.raises(RuntimeError) as refused:
        init_keyserver(shared, PASSPHRASE)
    print(refused.value)
    assert "give a new or empty directory" in str(refused.value)
    assert _mode(shared) == 0o755 and sorted(p.name for p in shared.iterdir()) == ["notes.txt"]
