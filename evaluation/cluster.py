"""Peer processes on this machine: start roots, subscribers and publishers as real
``ibe-pubsub`` processes, wait for them, read what they delivered, stop them.

Used by the demo and by the end-to-end tests. Tokens reach the children through
the environment (``IBE_PUBSUB_TOKEN``), never the command line; every child logs
to its own file in the work directory, where it also records the key server's
signing key on first contact (``IBE_PUBSUB_KNOWN_SERVERS``) and the event ids it published
(``IBE_PUBSUB_PUBLISHED_IDS``), not in the user's home.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ibe_pubsub.credentials import Event
from ibe_pubsub.evaluation.exceptions import EvaluationError
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.keyserver import KeyServerClient, KeyServerRequestError
from ibe_pubsub.peer import WaitAnnouncer, event_line, read_deliveries


def _option(name: str, value: object) -> list[str]:
    return [] if value is None else [name, str(value)]


class ClusterError(EvaluationError, RuntimeError):
    """A peer process did not start or finish as expected (its log is quoted)."""


@dataclass
class PeerProcess:
    name: str
    role: str
    process: subprocess.Popen[bytes]
    workdir: Path
    subscription: str | None = None
    address: str | None = None

    @property
    def ready_file(self) -> Path:
        return self.workdir / f"{self.name}.ready.json"

    @property
    def events_file(self) -> Path:
        return self.workdir / f"{self.name}.events.jsonl"

    @property
    def stats_file(self) -> Path:
        return self.workdir / f"{self.name}.stats.json"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_file.exists():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def delivered(self) -> list[dict[str, Any]]:
        return read_deliveries(self.events_file)

    def stats(self) -> dict[str, Any]:
        return json.loads(self.stats_file.read_text()) if self.stats_file.exists() else {}

    @property
    def http(self) -> str | None:
        """The URL of its --http endpoint, from its ready file (None if it serves none)."""
        if not self.ready_file.exists():
            return None
        return json.loads(self.ready_file.read_text()).get("http")

    def get(self, path: str) -> httpx.Response:
        """GET ``path`` (``/status``, ``/metrics``, ...) from its --http endpoint."""
        if self.http is None:
            raise ClusterError(f"{self.name} serves no --http endpoint")
        return httpx.get(self.http + path, timeout=10)

    def counter(self, name: str) -> float:
        """The value of the sample ``name`` in its ``/metrics``, read now: e.g.
        ``ibe_peer_transport_missed_total``, or with its labels as the peer writes them,
        ``ibe_peer_transport_dropped_total{reason="queue_delay"}``."""
        return next(float(line.split()[-1]) for line in self.get("/metrics").text.splitlines()
                    if line.startswith(name + " "))


@dataclass
class Cluster:
    """Processes of one overlay, all talking to the key server at ``server``."""

    server: str
    admin_token: str
    workdir: Path
    routing: str = "ohf"
    max_children: int = 4
    verbose: bool = False
    #: Plaintext peer links (``--insecure-transport``) instead of mutual TLS.
    insecure_transport: bool = False
    #: More ``peer run`` options for every peer, e.g. ``("--failure-timeout", "4")``.
    peer_args: tuple[str, ...] = ()
    peers: dict[str, PeerProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.admin = KeyServerClient(self.server, self.admin_token)

    # -- identities and processes -------------------------------------------------------------

    def identity(self, name: str, role: str, policy: str | None = None) -> str:
        """Create an identity; returns its token."""
        try:
            return str(self.admin.create_identity(name, role, policy)["token"])
        except KeyServerRequestError as exc:
            raise ClusterError(f"could not create the identity {name}: {exc}") from exc

    def _env(self, token: str | None) -> dict[str, str]:
        """The children's environment; without ``token`` they take it from their bundle."""
        env = child_env()
        env.pop("IBE_PUBSUB_TOKEN", None)
        if token is not None:
            env["IBE_PUBSUB_TOKEN"] = token
        env["IBE_PUBSUB_KNOWN_SERVERS"] = str(self.workdir / "known_servers.json")
        env["IBE_PUBSUB_PUBLISHED_IDS"] = str(self.workdir / "published_ids.json")
        return env

    def _spawn(self, name: str, role: str, token: str | None, args: list[str],
               subscription: str | None = None, script: Path | None = None,
               stdin: int = subprocess.DEVNULL, prefix: tuple[str, ...] = ()
               ) -> PeerProcess:
        env = self._env(token)
        log = (self.workdir / f"{name}.log").open("ab")
        verbosity = ["-v"] if self.verbose else []
        command = [*prefix, *([sys.executable, str(script), *verbosity, *args]
                              if script is not None else cli_command(*verbosity, *args))]
        try:
            process = subprocess.Popen(command, env=env,
                                       stdout=subprocess.DEVNULL, stderr=log, stdin=stdin)
        finally:
            log.close()
        peer = PeerProcess(name, role, process, self.workdir, subscription)
        self.peers[name] = peer
        return peer

    def _transport_args(self) -> list[str]:
        return ["--insecure-transport"] if self.insecure_transport else []

    def _run_args(self, peer_name: str, listen: str) -> list[str]:
        base = self.workdir / peer_name
        return ["peer", "run", "--server", self.server, "--listen", listen,
                "--routing", self.routing, "--max-children", str(self.max_children),
                "--ready-file", f"{base}.ready.json", "--stats-out", f"{base}.stats.json",
                *self._transport_args(), *self.peer_args]

    def start_root(self, name: str, attributes: list[str], token: str | None = None,
                   listen: str = "127.0.0.1:0", extra: tuple[str, ...] = ()) -> PeerProcess:
        """A root of ``attributes``; ``extra`` options override the cluster's ``peer_args``."""
        token = token or self.identity(name, "root")
        roots = [x for a in attributes for x in ("--root", a)]
        return self._spawn(name, "root", token, [*self._run_args(name, listen), *extra,
                                                 *roots])

    def start_subscriber(self, name: str, subscription: str | None, token: str | None = None,
                         listen: str = "127.0.0.1:0", bundle: Path | None = None,
                         extra: tuple[str, ...] = (), script: Path | None = None,
                         prefix: tuple[str, ...] = ()) -> PeerProcess:
        """A subscriber of ``subscription``, or with the keys of ``bundle`` (from ``bulk
        issue``; narrowed to ``subscription`` if given; its token unless ``token``); ``extra``
        options override the cluster's ``peer_args``. ``script``: a Python file run instead
        of ``python -m ibe_pubsub.cli`` with the same arguments (a peer altered for a fault
        test, which ends by running the command). ``prefix``: a command that runs it, e.g.
        ``ip netns exec NAME``."""
        if token is None and bundle is None:
            token = self.identity(name, "subscriber")
        return self._spawn(name, "subscriber", token, [
            *self._run_args(name, listen), *extra, *_option("--subscribe", subscription),
            *_option("--bundle", bundle),
            "--events-out", str(self.workdir / f"{name}.events.jsonl")], subscription, script,
            prefix=prefix)

    def wait_ready(self, peers: list[PeerProcess], timeout: float = 60.0) -> None:
        """Until every peer wrote its ready file; raises with the log of one that did not."""
        announcer = WaitAnnouncer("peers to join", limit=timeout)
        for i, peer in enumerate(peers):
            while not peer.ready_file.exists():
                if peer.process.poll() is not None:
                    raise ClusterError(f"{peer.name} exited with status "
                                       f"{peer.process.returncode}:\n{peer.log_tail()}")
                if announcer.expired:
                    raise ClusterError(f"{peer.name} not ready after {timeout} s:\n"
                                       f"{peer.log_tail()}")
                announcer.what = f"{peer.name} to join, with {i} of {len(peers)} ready"
                announcer.tick()
                time.sleep(0.05)
            peer.address = json.loads(peer.ready_file.read_text())["address"]

    def publish(self, name: str, events: list[Event], advertisement: str | None = "",
                token: str | None = None, interval: float = 0.0, timeout: float = 120.0,
                bundle: Path | None = None, stream_window: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        """Run ``ibe-pubsub publish`` on these events to completion (with ``bundle`` as in
        :meth:`start_subscriber`; as a stream with ``stream_window``)."""
        if token is None and bundle is None:
            token = self.identity(name, "publisher")
        events_path = self.workdir / f"{name}.input.jsonl"
        events_path.write_text("".join(json.dumps(
            {k: v for k, v in event_line(e).items() if k in ("id", "values", "body")}) + "\n"
            for e in events))
        return subprocess.run(
            cli_command("publish", "--server", self.server,
                        *_option("--advertise", advertisement), *_option("--bundle", bundle),
                        *_option("--stream-window", stream_window),
                        "--events", str(events_path), "--interval", str(interval),
                        "--sent-out", str(self.workdir / f"{name}.sent.jsonl"),
                        *self._transport_args()),
            env=self._env(token), capture_output=True, text=True, timeout=timeout,
            check=False)

    def start_feed(self, name: str, token: str, stream_window: str | None = None
                   ) -> PeerProcess:
        """``ibe-pubsub publish`` of a live feed: it advertises everything and sends each
        JSON line written to its ``process.stdin`` as it arrives (a stream with
        ``stream_window``), recording what it sent as :meth:`publish` does."""
        return self._spawn(name, "publisher", token, [
            "publish", "--server", self.server, "--advertise", "", "--events", "-",
            "--sent-out", str(self.workdir / f"{name}.sent.jsonl"),
            *_option("--stream-window", stream_window), *self._transport_args()],
            stdin=subprocess.PIPE)

    def sent_times(self, publisher: str) -> dict[str, float]:
        return {d["id"]: d["sent_at"] for d in read_deliveries(
            self.workdir / f"{publisher}.sent.jsonl")}

    # -- watching and stopping ----------------------------------------------------------------

    def subscribers(self, alive_only: bool = True) -> list[PeerProcess]:
        return [p for p in self.peers.values() if p.role == "subscriber"
                and (not alive_only or p.process.poll() is None)]

    def wait_deliveries(self, expected: dict[str, set[str]], timeout: float = 30.0,
                        settle: float = 1.0, idle: float = 10.0) -> None:
        """Until each named subscriber delivered at least its expected ids (then ``settle``
        more seconds for stragglers that should not come). Gives up after ``timeout``, or
        later while deliveries are still coming in (busy peers work through a backlog)
        until none came for ``idle`` seconds."""
        deadline = time.monotonic() + timeout
        seen = -1
        announcer = WaitAnnouncer("deliveries")
        while True:
            got = {n: {d["id"] for d in self.peers[n].delivered()} for n in expected}
            if all(ids <= got[n] for n, ids in expected.items()):
                time.sleep(settle)
                return
            total = sum(map(len, got.values()))
            announcer.what = f"deliveries ({total} of {sum(map(len, expected.values()))} in)"
            announcer.tick()
            if total != seen:
                seen, deadline = total, max(deadline, time.monotonic() + idle)
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def statuses(self) -> list[dict[str, Any]]:
        """``/status`` of every running peer that serves --http."""
        return [p.get("/status").json() for p in self.peers.values()
                if p.process.poll() is None and p.http is not None]

    def kill(self, name: str) -> None:
        """Crash a peer (SIGKILL: no goodbye to its neighbours)."""
        peer = self.peers[name]
        peer.process.kill()
        peer.process.wait()

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every peer (graceful leave, stats written), SIGKILL stragglers."""
        running = [p for p in self.peers.values() if p.process.poll() is None]
        for peer in running:
            peer.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for peer in running:
            try:
                peer.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                peer.process.kill()
                peer.process.wait()
        self.admin.close()


def cluster_with_keyserver(workdir: Path, max_children: int
                           ) -> tuple[Cluster, subprocess.Popen[bytes]]:
    """A fresh key server in ``workdir`` (a random passphrase, a free port), ready, and a
    cluster of peers around it; the caller stops both (the server is stopped here if it
    never answers)."""
    passphrase = secrets.token_urlsafe(24)
    data = workdir / "keyserver"
    init_keyserver(data, passphrase)
    port = free_port()
    server = start_keyserver(data, port, passphrase, log=workdir / "keyserver.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
    except BaseException:
        stop(server)
        raise
    return Cluster(url, (data / "admin.token").read_text().strip(), workdir / "peers",
                   max_children=max_children), server
