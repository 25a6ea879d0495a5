"""Hosts of their own on one machine, in network namespaces: two joined by a veth pair whose
packets pass through :mod:`evaluation.link_emulator` (delay, loss, partitions), or one with
only a loopback interface and the ephemeral ports a test chooses (:func:`loopback_host`).

The *core* namespace holds the key server, the roots, the publishers and most
subscribers; the *group* namespace holds a few subscribers, as if on another host behind
a slow, lossy link. The caller's thread enters the core namespace for the lifetime of the
context (so that everything it starts, and every connection it makes, stays inside the
namespaces made here: no packet reaches another address), and leaves it on the way out;
processes of the group are started through :attr:`SplitNetwork.group_prefix`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from ibe_pubsub.evaluation.exceptions import NetworkLabError

CORE_ADDRESS, GROUP_ADDRESS = "10.213.0.1", "10.213.0.2"
_CLONE_NEWNET = 0x40000000


def unavailable(tools: tuple[str, ...] = ("ip", "iptables")) -> str | None:
    """Why the namespaces cannot be built here, or None when they can (with ``tools``:
    the split network needs ``iptables`` too, :func:`loopback_host` only ``ip``)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "not running as root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"the {tool} command is not installed (Debian: iproute2, iptables)"
    return None


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace open as ``fd``."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise NetworkLabError(error, f"setns: {os.strerror(error)}")


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """The calling thread inside ``namespace`` for the context (so that what it starts and
    every connection it makes stay there), back in its own namespace after."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        yield
    finally:
        try:
            _setns(home)
        finally:
            os.close(home)


@contextlib.contextmanager
def loopback_host(ports: tuple[int, int]) -> Iterator[None]:
    """A host of its own for the calling thread: a new namespace with only its loopback
    interface, whose ephemeral ports (those a bind to port 0 and an outgoing connection
    draw from) are ``ports`` (first and last), so that a test knows which ports the system
    can pick. Deleted on the way out."""
    name = f"ibe{os.getpid():x}-{secrets.token_hex(4)}-lo"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "-n", name, "link", "set", "lo", "up")
        with entered(name):
            # /proc/sys/net is the namespace of the thread that opens it: this one's now
            Path("/proc/sys/net/ipv4/ip_local_port_range").write_text(f"{ports[0]} {ports[1]}")
            yield
    finally:
        with contextlib.suppress(NetworkLabError):
            _run("ip", "netns", "delete", name)


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkLabError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


class SplitNetwork:
    """The two namespaces, the link between them and its emulator (a context manager)."""

    def __init__(self, delay_ms: float, loss: float, seed: int, log: Path) -> None:
        self.delay_ms, self.loss, self.seed, self.log = delay_ms, loss, seed, log
        # Unique to this instance (a stale pair from an earlier process with this pid is
        # never taken for, or deleted as, this one's).
        tag = f"ibe{os.getpid():x}{secrets.randbelow(256):02x}"
        self.core, self.group = f"{tag}-core", f"{tag}-group"
        self._core_link, self._group_link = f"{tag}c", f"{tag}g"
        self._emulator: subprocess.Popen[bytes] | None = None
        self._inside = contextlib.ExitStack()  # the caller's thread in the core namespace
        self._made: list[str] = []  # the namespaces this instance created

    @property
    def group_prefix(self) -> tuple[str, ...]:
        """The command prefix that runs a program in the group namespace."""
        return ("ip", "netns", "exec", self.group)

    def open(self) -> SplitNetwork:
        """Build the namespaces, the link and its emulator, and enter the core namespace;
        on a failure (:class:`NetworkLabError`: no capability, no ``NFQUEUE`` in the
        kernel), whatever was built is removed again."""
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Leave the core namespace, stop the emulator, delete what this instance built."""
        self._tear_down()

    def __enter__(self) -> SplitNetwork:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _build(self) -> None:
        for space in (self.core, self.group):
            _run("ip", "netns", "add", space)
            self._made.append(space)
        _run("ip", "link", "add", self._core_link, "netns", self.core, "type", "veth",
             "peer", "name", self._group_link, "netns", self.group)
        for space, link, address in ((self.core, self._core_link, CORE_ADDRESS),
                                     (self.group, self._group_link, GROUP_ADDRESS)):
            _run("ip", "-n", space, "address", "add", f"{address}/24", "dev", link)
            _run("ip", "-n", space, "link", "set", "lo", "up")
            _run("ip", "-n", space, "link", "set", link, "up")
        # Every packet crossing the link, both ways, goes through the emulator's queue (and
        # is dropped, not let through, if the emulator is not there).
        for chain, direction in (("OUTPUT", "-o"), ("INPUT", "-i")):
            _run(*self.group_prefix, "iptables", "-A", chain, direction, self._group_link,
                 "-j", "NFQUEUE", "--queue-num", "0")
        out = self.log.open("wb")
        try:
            self._emulator = subprocess.Popen(
                [*self.group_prefix, sys.executable, "-m",
                 "ibe_pubsub.evaluation.link_emulator", "--queue", "0",
                 "--delay-ms", str(self.delay_ms), "--loss", str(self.loss),
                 "--seed", str(self.seed)], stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()
        self._wait_for_emulator()
        self._inside.enter_context(entered(self.core))

    def _wait_for_emulator(self, timeout: float = 30.0) -> None:
        """Until the emulator has bound its queue (until then the link drops everything)."""
        assert self._emulator is not None
        deadline = time.monotonic() + timeout
        while "link: queue" not in self.log.read_text(errors="replace"):
            if self._emulator.poll() is not None or time.monotonic() > deadline:
                raise NetworkLabError(f"the link emulator did not start: {self.log.read_text()}")
            time.sleep(0.05)

    def _signal(self, number: int) -> None:
        if self._emulator is None or self._emulator.poll() is not None:
            raise NetworkLabError(f"the link emulator is not running (see {self.log})")
        self._emulator.send_signal(number)

    @property
    def emulator_running(self) -> bool:
        return self._emulator is not None and self._emulator.poll() is None

    def partition(self) -> None:
        """Cut the link: every packet between the namespaces is dropped, silently."""
        self._signal(signal.SIGUSR1)

    def heal(self) -> None:
        self._signal(signal.SIGUSR2)

    def _tear_down(self) -> None:
        self._inside.close()
        if self._emulator is not None:
            self._emulator.terminate()
            try:
                self._emulator.wait(5)
            except subprocess.TimeoutExpired:
                self._emulator.kill()
                self._emulator.wait()
        while self._made:  # deleting them deletes the link
            with contextlib.suppress(OSError):
                _run("ip", "netns", "delete", self._made.pop())
