"""A damaged data directory stops `keyserver serve` with one line and status 2, never a
traceback: bad scrypt parameters (bounded before scrypt runs), a sealed secret that is not
a map, a corrupt or unknown database, a missing or empty admin token."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from keyserver_fixtures import PASSPHRASE

from ibe_pubsub.evaluation.launcher import init_keyserver, serve_expecting_exit
from ibe_pubsub.keyserver.keystore import ADMIN_TOKEN_FILE, DATABASE_FILE, SEALED_FILE
from ibe_pubsub.keyserver.sealing import seal_secret


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("startup") / "ks"
    init_keyserver(data, PASSPHRASE)
    return data


def _copy(pristine: Path, tmp_path: Path) -> Path:
    """A private copy (copytree keeps the 0700/0600 modes) to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "ks"))


def _scrypt(**fields: object) -> Callable[[Path], None]:
    def damage(data: Path) -> None:
        doc = json.loads((data / SEALED_FILE).read_text())
        (data / SEALED_FILE).write_text(json.dumps({**doc, **fields}))
    return damage


def _sealed_list(data: Path) -> None:
    """Authentic under the right passphrase, but a msgpack list instead of the map."""
    (data / SEALED_FILE).write_bytes(seal_secret(msgpack.packb([b"msk", b"signing_key"]),
                                                 PASSPHRASE))


def _garbage_database(data: Path) -> None:
    (data / DATABASE_FILE).write_bytes(b"not a database " * 4096)


def _unknown_revision(data: Path) -> None:
    """A database migrated by some newer build: Alembic does not know its revision."""
    with sqlite3.connect(data / DATABASE_FILE) as db:
        db.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    db.close()


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "scrypt-n-minus-one": (_scrypt(n=-1), "n must be a power of two"),
    "scrypt-n-not-power-of-two": (_scrypt(n=3), "n must be a power of two"),
    "scrypt-n-not-an-integer": (_scrypt(n="32768"), "must be integers"),
    "scrypt-n-huge": (_scrypt(n=2**40), "out of bounds"),
    "scrypt-r-huge": (_scrypt(r=2**30), "out of bounds"),
    "scrypt-p-huge": (_scrypt(p=10**6), "out of bounds"),
    "secret-not-a-map": (_sealed_list, "expected a map"),
    "database-garbage": (_garbage_database, "file is not a database"),
    "database-unknown-revision": (_unknown_revision, "cannot use the database"),
    "admin-token-empty": (lambda d: (d / ADMIN_TOKEN_FILE).write_text("\n"), "is empty"),
    "admin-token-missing": (lambda d: (d / ADMIN_TOKEN_FILE).unlink(), "admin token"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_start_up_state_gives_one_line_and_a_non_zero_exit(pristine, tmp_path, case):
    damage, expected = CASES[case]
    data = _copy(pristine, tmp_path)
    damage(data)
    start = time.monotonic()
    done = serve_expecting_exit(data, PASSPHRASE, ("--workers", "1"), timeout=90)
    elapsed = time.monotonic() - start
    print(f"{case}: refused in {elapsed:.2f} s: {done.stderr.strip()}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ibe-pubsub: error: "), done.stderr
    assert expected in lines[0]


def test_control_the_undamaged_copy_starts(pristine, tmp_path, keyserver_factory):
    """The copies themselves are sound: only the damage makes `serve` refuse."""
    server = keyserver_factory.start(data_dir=_copy(pristine, tmp_path),
                                     serve_args=("--workers", "1"))
    assert server.admin_token
