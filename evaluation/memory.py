"""Peak resident memory and CPU time of this process and of those it started, from /proc.

``bench bulk`` states the peak memory of each engine: the driver (this process), and
for Spark also its JVM and its Python workers, which are this process's descendants
in local mode. A thread reads ``VmRSS`` of each of them every ``interval`` seconds and
keeps the highest sum per group; a peak shorter than the interval can be missed. It
also keeps each descendant's last seen CPU time (user + system), which says where a
Spark job's time goes; CPU used after a process's last sample is not counted.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")


def rss_bytes(pid: int) -> int:
    """Resident bytes of a process (0 if it is gone)."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


#: The state column of /proc/net/tcp for an established connection.
_ESTABLISHED = "01"


def descriptors(pid: int) -> tuple[int, int]:
    """Open file descriptors of a process, and how many of them are established TCP
    connections (0, 0 if it is gone).

    A peer's connections come and go with the trees' shape (a child attaches, a watcher
    leaves), so a leak shows in the rest: files, pipes, listening sockets, and sockets
    whose other end has closed but this process has not (CLOSE_WAIT)."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return 0, 0
    links = []
    for name in names:
        try:
            links.append(os.readlink(fd_dir / name))
        except OSError:  # closed since the listing
            continue
    sockets = {link[8:-1] for link in links if link.startswith("socket:[")}
    established = set()
    for table in ("tcp", "tcp6"):  # the process's own network namespace
        try:
            rows = (PROC / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == _ESTABLISHED and fields[9] in sockets:
                established.add(fields[9])
    return len(links), len(established)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 if it is gone)."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started that still run."""
    out: list[int] = []
    try:
        for task in (PROC / str(pid) / "task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def _group(pid: int) -> str:
    """"jvm" for a Java process, "python workers" for anything else this process started."""
    try:
        name = (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "python workers"
    return "jvm" if name == "java" else "python workers"


class PeakMemory:
    """Context manager: peak RSS in bytes per group ("driver", "jvm", "python workers")."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peaks: dict[str, int] = {"driver": 0}
        self._cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peak-memory", daemon=True)

    def sample(self) -> None:
        sums = {"driver": rss_bytes(os.getpid())}
        todo = child_pids(os.getpid())
        while todo:
            pid = todo.pop()
            group = _group(pid)
            sums[group] = sums.get(group, 0) + rss_bytes(pid)
            self._cpu[pid] = (group, max(_cpu_seconds(pid), self._cpu.get(pid, ("", 0.0))[1]))
            todo += child_pids(pid)
        for group, value in sums.items():
            self.peaks[group] = max(self.peaks.get(group, 0), value)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def child_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds per group of descendants ("jvm", "python workers")."""
        out: dict[str, float] = {}
        for group, seconds in self._cpu.values():
            out[group] = round(out.get(group, 0.0) + seconds, 1)
        return out

    def megabytes(self) -> dict[str, float]:
        return {group: round(value / 2 ** 20, 1) for group, value in self.peaks.items()}
