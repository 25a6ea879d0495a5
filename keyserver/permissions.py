"""Keeping the data directory private: the directory 0700, everything in it 0600.

The directory holds the sealed master secret, the admin token and the database of
identities and subscriptions; no other local account has any business reading it.
``init`` creates it private, both commands run under a private umask (so SQLite's
``-wal``/``-shm`` files and anything else created later come out 0600), and
``serve`` refuses to start on a directory that group or others can reach.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from ibe_pubsub.keyserver.keystore import KeyStoreError

PRIVATE_UMASK = 0o077
PRIVATE_DIR_MODE = 0o700
OPEN_BITS = stat.S_IRWXG | stat.S_IRWXO


class UnsafePermissionsError(KeyStoreError):
    """Group or other users can reach the data directory or something in it."""


def use_private_umask() -> None:
    """Make every file this process creates from now on private to its owner (for the
    command's own process: the umask is process-wide)."""
    os.umask(PRIVATE_UMASK)


def unsafe_entries(data_dir: Path) -> list[tuple[Path, int]]:
    """The directory and the entries below it with group/other bits, with their modes
    (symbolic links are skipped: their own mode means nothing). A missing directory has
    none, so the caller's own "no key store" message wins."""
    if not data_dir.is_dir():
        return []
    found = []
    for path in (data_dir, *sorted(data_dir.rglob("*"))):
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & OPEN_BITS:
            found.append((path, stat.S_IMODE(mode)))
    return found


def require_private(data_dir: Path, override: str | None = None) -> None:
    """Raise :class:`UnsafePermissionsError` naming the first unsafe entry and the fix;
    ``override`` names the option that would accept it anyway."""
    unsafe = unsafe_entries(data_dir)
    if not unsafe:
        return
    path, mode = unsafe[0]
    more = f" (and {len(unsafe) - 1} more)" if len(unsafe) > 1 else ""
    alternative = f", or start with {override} to accept it" if override else ""
    raise UnsafePermissionsError(
        f"{path} is open to group/other users (mode {mode:04o}){more}: run "
        f"`chmod -R go= {shlex.quote(str(data_dir))}`{alternative}")


def make_private_dir(data_dir: Path) -> None:
    """Create ``data_dir`` as 0700 or tighten it if it is empty; a directory with other
    contents is never changed (it might be a shared one such as /tmp), only refused if
    group or others can reach anything in it."""
    if not data_dir.exists():
        data_dir.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
        return
    unsafe = unsafe_entries(data_dir)
    if not unsafe:
        return
    if any(data_dir.iterdir()):
        path, mode = unsafe[0]
        raise UnsafePermissionsError(
            f"{path} is open to group/other users (mode {mode:04o}): give a new or empty "
            "directory for the key store")
    data_dir.chmod(PRIVATE_DIR_MODE)
