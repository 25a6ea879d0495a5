"""``bench soak``: real processes for a long run, with faults on a seeded schedule.

A key server with short epochs, a root per attribute of the stock schema, subscribers
with varied subscriptions in both routing modes (OHF and MCR alternate), and three live
feeds through ``ibe-pubsub publish``: version-2 events, a stream, and a version-2
publisher whose identity is revoked half-way. Faults, on a schedule a seed fixes:

* ``subscriber_kill``: SIGKILL of a random subscriber every ``kill_every`` seconds,
  restarted (same identity) after a random pause;
* ``subscriber_stop``: SIGSTOP of a subscriber for longer than the failure timeout, then
  SIGCONT (a peer that hangs rather than dies);
* ``root_kill``: SIGKILL of a root, restarted after a pause;
* ``keyserver_kill``: SIGKILL of the key server while events flow, restarted from the same
  data directory on the same port;
* ``revocation``: the third publisher's identity revoked;
* ``partition``: where the run may build network namespaces (as root), the last
  ``group`` subscribers run "on another host": in a namespace of their own, behind a link
  that delays every packet and loses some (:mod:`evaluation.netns`); the link is cut for
  ``partition_seconds``, then healed.

A few subscribers are never killed or stopped, so that their memory and descriptors can
be followed over the whole run. Every process runs with ``-v``, so the key server's
answers each one saw are in its log, for the audit check. The run records what it needs
for :mod:`evaluation.soak_oracle`, which decides what was owed and what was lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import default_schema
from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess
from ibe_pubsub.evaluation.exceptions import BenchSettingsError
from ibe_pubsub.evaluation.launcher import (
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.memory import child_pids, descriptors, rss_bytes
from ibe_pubsub.evaluation.netns import CORE_ADDRESS, GROUP_ADDRESS, SplitNetwork, unavailable
from ibe_pubsub.evaluation.soak_trees import read_links
from ibe_pubsub.evaluation.stock_workload import event_values, subscription_text
from ibe_pubsub.keyserver import KeyServerClient

#: Seconds between samples of every process's memory and descriptors, and the fewest
#: samples a run takes (a short run samples more often).
SAMPLE_EVERY, MIN_SAMPLES = 5.0, 60
#: When the namespace group's link is cut, as a share of the run.
PARTITION_AT = 0.15
#: The publisher whose identity the run revokes.
REVOKED_PUBLISHER = "pub-revoked"
FAULT_KINDS = ("subscriber_kill", "subscriber_stop", "root_kill", "keyserver_kill",
               "revocation", "partition")


@dataclass(frozen=True)
class SoakSettings:
    """The size, rates and fault schedule of a soak run (``bench soak --help``)."""

    minutes: float = 30.0
    subscribers: int = 24
    #: Subscribers that are never killed or stopped (their memory is followed).
    steady: int = 6
    epoch_seconds: int = 120
    grace_seconds: int = 30
    #: Events per second of the version-2 feed, the stream and the revoked publisher (with
    #: 24 subscribers these keep the 2-core machine busy but not behind).
    v2_rate: float = 2.0
    stream_rate: float = 5.0
    revoked_rate: float = 1.0
    kill_every: float = 20.0
    #: A killed subscriber restarts after a pause drawn from this range (seconds).
    restart_pause: tuple[float, float] = (2.0, 10.0)
    #: Pause before a killed root or key server restarts (seconds).
    server_pause: float = 3.0
    failure_timeout: float = 5.0
    seed: int = 1
    #: Seconds between the end of the feeds and the end of the run, for the last events.
    drain: float = 15.0
    #: Subscribers in a network namespace of their own (where root; 0: none), behind a link
    #: with this delay each way and this packet loss, cut once for ``partition_seconds``.
    group: int = 4
    link_delay_ms: float = 20.0
    link_loss: float = 0.01
    partition_seconds: float = 20.0

    def __post_init__(self) -> None:
        if self.minutes <= 0 or self.subscribers < 2 or not 0 <= self.steady < self.subscribers:
            raise BenchSettingsError("a soak needs minutes > 0, at least 2 subscribers and "
                                     "fewer steady subscribers than subscribers")
        if not 0 < 2 * self.grace_seconds <= self.epoch_seconds:
            raise BenchSettingsError("the grace window must be positive and at most half "
                                     "the epoch")
        if min(self.v2_rate, self.stream_rate, self.revoked_rate, self.kill_every,
               self.failure_timeout, self.partition_seconds) <= 0:
            raise BenchSettingsError("rates, kill_every, failure_timeout and "
                                     "partition_seconds must be positive")
        if not (0 <= self.group <= self.subscribers and self.link_delay_ms >= 0
                and 0 <= self.link_loss < 1):
            raise BenchSettingsError("the group must be 0 to all subscribers, the link's delay "
                                     "at least 0 and its loss in [0, 1)")
        if self.group and PARTITION_AT * self.seconds + self.kill_every / 2 \
                + self.partition_seconds >= self.seconds:
            raise BenchSettingsError("the partition must heal before the run ends: shorten "
                                     "--partition or lengthen --minutes")

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0


@dataclass
class Fault:
    """One scheduled fault: ``at`` seconds into the run, until ``until`` (restart, SIGCONT;
    equal to ``at`` for a revocation)."""

    at: float
    kind: str
    target: str
    until: float


@dataclass
class Incarnation:
    """One process of a named peer, from its start to its end (wall-clock times)."""

    name: str
    role: str
    pid: int
    started: float
    ready: float | None = None
    ended: float | None = None
    #: "killed" (by the schedule), "stopped" (at the end), "exited" (on its own).
    end: str = ""
    returncode: int | None = None
    #: (from, to) wall-clock intervals in which it was SIGSTOPped.
    paused: list[tuple[float, float]] = field(default_factory=list)
    #: The address it listened at (a peer, once ready).
    address: str | None = None


def schedule(settings: SoakSettings, subscribers: list[str], roots: list[str],
             partition: bool = False) -> list[Fault]:
    """The faults of a run, from its seed: the same settings give the same schedule (a
    ``partition`` of the namespace group, if asked, draws nothing from the seed)."""
    rng = random.Random(f"soak-{settings.seed}")
    total = settings.seconds
    victims = subscribers[settings.steady:]
    faults = []
    at = settings.kill_every
    while at < total - settings.kill_every:
        faults.append(Fault(at, "subscriber_kill", rng.choice(victims),
                            at + rng.uniform(*settings.restart_pause)))
        at += settings.kill_every
    stop_for = 2.5 * settings.failure_timeout
    one_off = [(0.3, "root_kill", rng.choice(roots), settings.server_pause),
               (0.4, "subscriber_stop", rng.choice(victims), stop_for),
               (0.5, "revocation", REVOKED_PUBLISHER, 0.0),
               (0.65, "keyserver_kill", "keyserver", settings.server_pause)]
    if partition:
        one_off.append((PARTITION_AT, "partition", "group", settings.partition_seconds))
    for share, kind, target, lasts in one_off:
        start = share * total + settings.kill_every / 2  # between two subscriber kills
        faults.append(Fault(start, kind, target, start + lasts))
    faults.sort(key=lambda f: f.at)
    # A subscriber is never killed while it is stopped, nor stopped while it is down.
    busy: dict[str, float] = {}
    kept = []
    for fault in faults:
        if fault.kind.startswith("subscriber_") and busy.get(fault.target, -1.0) >= fault.at:
            continue
        busy[fault.target] = fault.until
        kept.append(fault)
    return kept


def subscriptions(settings: SoakSettings) -> list[str]:
    """Varied subscriptions: a third broad price ranges, the rest from the stock workload's
    vocabulary (a symbol, a price window, sometimes a volume floor)."""
    rng = random.Random(f"soak-subscriptions-{settings.seed}")
    out = []
    for i in range(settings.subscribers):
        if i % 3 == 0:
            low = 100 * rng.randrange(6)
            out.append(f"price in [{low}, {low + 400}]")
        else:
            out.append(subscription_text(rng))
    return out


class _Feed:
    """A thread writing one event line to a publisher's stdin on a schedule (the k-th at
    start + k/rate), recording each event's values by id."""

    def __init__(self, peer: PeerProcess, prefix: str, rate: float, seed: int) -> None:
        self.peer, self.prefix, self.rate = peer, prefix, rate
        self.rng = random.Random(f"{prefix}-{seed}")
        self.values: dict[str, dict[str, Any]] = {}
        self.closed_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feed-{prefix}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        assert self.peer.process.stdin is not None
        start, k = time.monotonic(), 0
        while not self._stop.is_set():
            due = start + k / self.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            event_id = f"{self.prefix}-{k:06d}"
            values = event_values(self.rng)
            try:
                self.peer.process.stdin.write(
                    (json.dumps({"id": event_id, "values": values}) + "\n").encode())
                self.peer.process.stdin.flush()
            except (BrokenPipeError, OSError):
                break  # the publisher ended (refused after its revocation)
            self.values[event_id] = values
            k += 1
        self.closed_at = time.time()
        with contextlib.suppress(OSError):
            self.peer.process.stdin.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


class SoakRun:
    """The processes of one soak run and what happened to them."""

    def __init__(self, settings: SoakSettings, workdir: Path,
                 progress: Callable[[str], None] = print,
                 database_url: str | None = None, network: SplitNetwork | None = None,
                 network_skipped: str | None = None) -> None:
        self.settings = settings
        self.database = ("--database-url", database_url) if database_url else ()
        self.workdir = workdir
        self.progress = progress
        self.passphrase = f"soak-{random.Random(settings.seed).getrandbits(64):x}"
        self.data = workdir / "keyserver"
        self.network, self.network_skipped = network, network_skipped
        #: The address of the key server and of every peer outside the namespace group.
        self.host = CORE_ADDRESS if network is not None else "127.0.0.1"
        self.group: list[str] = []
        #: Plain HTTP off loopback is refused unless asked for: here the "other host" is a
        #: namespace of this machine, and the run is about the link, not the server's TLS.
        self._plain_http = ("--insecure",) if network is not None else ()
        self.port = free_port()
        self.url = f"http://{self.host}:{self.port}"
        self.keyserver: subprocess.Popen[bytes] | None = None
        self.cluster: Cluster | None = None
        self.tokens: dict[str, str] = {}
        self.ids: dict[str, int] = {}
        self.subscriptions: dict[str, str] = {}
        self.routing: dict[str, str] = {}
        self.roots: dict[str, str] = {}  # name -> attribute
        self.incarnations: list[Incarnation] = []
        self.live: dict[str, Incarnation] = {}
        self.feeds: dict[str, _Feed] = {}
        self.samples: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.done_faults: list[dict[str, Any]] = []
        self.descendants: set[int] = set()
        self.revoked_at: float | None = None
        self.revoked_epoch: dict[str, Any] | None = None
        self.audit_log: list[dict[str, Any]] = []
        #: Restarted peers not ready yet, with the record of the fault that restarted them.
        self._awaiting: dict[str, tuple[PeerProcess, dict[str, Any]]] = {}
        self.started = 0.0

    # -- processes ---------------------------------------------------------------------------

    def _start_keyserver(self) -> None:
        self.keyserver = start_keyserver(self.data, self.port, self.passphrase,
                                         ("-v", *self.database, *self._plain_http),
                                         log=self.workdir / "keyserver.log", host=self.host)
        wait_ready(self.url, self.keyserver)
        self._track("keyserver", "keyserver", self.keyserver.pid)

    def _track(self, name: str, role: str, pid: int) -> Incarnation:
        incarnation = Incarnation(name, role, pid, time.time())
        self.incarnations.append(incarnation)
        self.live[name] = incarnation
        return incarnation

    def _spawned(self, peer: PeerProcess) -> None:
        self._track(peer.name, peer.role, peer.process.pid)

    def _start_root(self, name: str) -> PeerProcess:
        assert self.cluster is not None
        self.cluster.peers.pop(name, None)
        (self.cluster.workdir / f"{name}.ready.json").unlink(missing_ok=True)
        peer = self.cluster.start_root(name, [self.roots[name]], token=self.tokens[name],
                                       listen=f"{self.host}:0")
        self._spawned(peer)
        return peer

    def _start_subscriber(self, name: str) -> PeerProcess:
        assert self.cluster is not None
        (self.cluster.workdir / f"{name}.ready.json").unlink(missing_ok=True)
        elsewhere = self.network is not None and name in self.group
        peer = self.cluster.start_subscriber(
            name, self.subscriptions[name], token=self.tokens[name],
            extra=("--routing", self.routing[name]),
            listen=f"{GROUP_ADDRESS if elsewhere else self.host}:0",
            prefix=self.network.group_prefix if elsewhere and self.network else ())
        self._spawned(peer)
        return peer

    def _identity(self, name: str, role: str) -> None:
        assert self.cluster is not None
        created = self.cluster.admin.create_identity(name, role)
        self.tokens[name], self.ids[name] = created["token"], created["id"]

    def _wait_ready(self, peers: list[PeerProcess]) -> None:
        assert self.cluster is not None
        self.cluster.wait_ready(peers, timeout=120)
        for peer in peers:
            self._was_ready(peer)

    def _was_ready(self, peer: PeerProcess) -> float:
        """Record when the peer's current process became ready, and its address."""
        incarnation = self.live[peer.name]
        incarnation.ready = peer.ready_file.stat().st_mtime
        incarnation.address = json.loads(peer.ready_file.read_text())["address"]
        return incarnation.ready

    def start(self) -> None:
        s = self.settings
        init_keyserver(self.data, self.passphrase, ("--epoch-seconds", str(s.epoch_seconds),
                                                    "--grace-seconds", str(s.grace_seconds),
                                                    *self.database))
        self._start_keyserver()
        token = (self.data / "admin.token").read_text().strip()
        self.cluster = Cluster(self.url, token, self.workdir / "peers", verbose=True,
                               peer_args=("--failure-timeout", str(s.failure_timeout)))
        for attribute in default_schema().names:
            name = f"root-{attribute}"
            self.roots[name] = attribute
            self._identity(name, "root")
        self._wait_ready([self._start_root(name) for name in self.roots])
        self.progress(f"soak: key server and {len(self.roots)} roots ready")
        for i, text in enumerate(subscriptions(s)):
            name = f"sub-{i:02d}"
            self.subscriptions[name] = text
            self.routing[name] = ("ohf", "mcr")[i % 2]
            self._identity(name, "subscriber")
        if self.network is not None and s.group:
            self.group = list(self.subscriptions)[-s.group:]
        started = [self._start_subscriber(name) for name in self.subscriptions]
        self._wait_ready(started)
        self.progress(f"soak: {len(started)} subscribers ready")
        for name, prefix, rate, window in (("pub-v2", "v2", s.v2_rate, None),
                                           ("pub-stream", "stream", s.stream_rate, "1s"),
                                           (REVOKED_PUBLISHER, "revoked", s.revoked_rate, None)):
            self._identity(name, "publisher")
            peer = self.cluster.start_feed(name, self.tokens[name], window)
            self._track(name, "publisher", peer.process.pid)
            self.feeds[name] = _Feed(peer, prefix, rate, s.seed)
        self.faults = schedule(s, list(self.subscriptions), list(self.roots),
                               partition=bool(self.group))
        self.started = time.time()
        for feed in self.feeds.values():
            feed.start()

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> None:
        s = self.settings
        actions: list[tuple[float, int, Callable[[], None]]] = []
        for i, fault in enumerate(self.faults):
            actions.append((fault.at, i, lambda f=fault: self._begin(f)))
            if fault.until > fault.at:
                actions.append((fault.until, i, lambda f=fault: self._end(f)))
        actions.sort(key=lambda a: (a[0], a[1]))
        next_sample = 0.0
        last_report = 0.0
        while True:
            elapsed = time.time() - self.started
            while actions and actions[0][0] <= elapsed:
                actions.pop(0)[2]()
            if elapsed >= next_sample:
                self._sample()
                next_sample += min(SAMPLE_EVERY, s.seconds / MIN_SAMPLES)
            self._notice_exits()
            self._notice_ready()
            if elapsed >= s.seconds:
                break
            if elapsed - last_report >= 60:
                last_report = elapsed
                self.progress(f"soak: {elapsed / 60:.0f} of {s.minutes:g} min, "
                              f"{len(self.done_faults)} faults so far")
            time.sleep(0.1)

    def _begin(self, fault: Fault) -> None:
        now = time.time()
        record = {**asdict(fault), "started": now}
        if fault.target not in self.live and fault.kind not in ("revocation", "partition"):
            self.progress(f"soak: {fault.kind} {fault.target} skipped: it is not running")
            return
        if fault.kind in ("subscriber_kill", "root_kill"):
            self._kill(fault.target, now)
        elif fault.kind == "subscriber_stop":
            os.kill(self.live[fault.target].pid, signal.SIGSTOP)
            self.live[fault.target].paused.append((now, now))
        elif fault.kind == "keyserver_kill":
            assert self.keyserver is not None
            self.keyserver.kill()
            self.keyserver.wait()
            self._ended("keyserver", now, "killed", self.keyserver.returncode)
        elif fault.kind == "revocation":
            assert self.cluster is not None
            self.revoked_epoch = self.cluster.admin.epoch()
            self.cluster.admin.revoke(self.ids[fault.target])
            self.revoked_at = now
        elif fault.kind == "partition":
            assert self.network is not None
            self.network.partition()
        self.done_faults.append(record)
        self.progress(f"soak: {fault.kind} {fault.target} at {fault.at:.0f} s")

    def _end(self, fault: Fault) -> None:
        now = time.time()
        record = next((r for r in reversed(self.done_faults) if r["at"] == fault.at
                       and r["kind"] == fault.kind), None)
        if record is None:  # skipped: nothing to end
            return
        record["ended"] = now
        if fault.kind == "subscriber_stop":
            incarnation = self.live[fault.target]
            os.kill(incarnation.pid, signal.SIGCONT)
            incarnation.paused[-1] = (incarnation.paused[-1][0], now)
        elif fault.kind == "keyserver_kill":
            self._start_keyserver()
        elif fault.kind == "partition":
            assert self.network is not None
            self.network.heal()
        elif fault.kind in ("root_kill", "subscriber_kill"):
            # Not waited for here: a peer may wait for the key server, whose own restart
            # must not wait behind it.
            start = self._start_root if fault.kind == "root_kill" else self._start_subscriber
            self._awaiting[fault.target] = (start(fault.target), record)
            return
        record["ready"] = time.time()

    def _notice_ready(self) -> None:
        """Restarted peers that wrote their ready file since the last look."""
        for name, (peer, record) in list(self._awaiting.items()):
            if name not in self.live:  # it exited before it was ready
                del self._awaiting[name]
            elif peer.ready_file.exists():
                record["ready"] = self._was_ready(peer)
                del self._awaiting[name]

    def _kill(self, name: str, now: float) -> None:
        assert self.cluster is not None
        self.cluster.kill(name)
        self._ended(name, now, "killed", self.cluster.peers[name].process.returncode)

    def _ended(self, name: str, at: float, how: str, returncode: int | None) -> None:
        incarnation = self.live.pop(name)
        incarnation.ended, incarnation.end, incarnation.returncode = at, how, returncode
        if incarnation.paused and incarnation.paused[-1][0] == incarnation.paused[-1][1]:
            incarnation.paused[-1] = (incarnation.paused[-1][0], at)

    def _processes(self) -> dict[str, subprocess.Popen[bytes]]:
        assert self.cluster is not None
        out: dict[str, subprocess.Popen[bytes]] = {
            name: peer.process for name, peer in self.cluster.peers.items()}
        if self.keyserver is not None:
            out["keyserver"] = self.keyserver
        return out

    def _notice_exits(self) -> None:
        """A process that ended without being told to (a crash, or the revoked publisher
        refused its next keys) is recorded as exited."""
        for name, process in self._processes().items():
            if name in self.live and process.poll() is not None:
                self._ended(name, time.time(), "exited", process.returncode)
                self.progress(f"soak: {name} exited on its own with status "
                              f"{process.returncode}")

    def _sample(self) -> None:
        sample: dict[str, Any] = {"t": time.time() - self.started, "rss_mib": {}, "fds": {},
                                  "connections": {}}
        for name, incarnation in self.live.items():
            rss = rss_bytes(incarnation.pid)
            if rss:
                sample["rss_mib"][name] = round(rss / 2**20, 2)
                fds, connections = descriptors(incarnation.pid)
                sample["fds"][name], sample["connections"][name] = fds, connections
            todo = child_pids(incarnation.pid)
            while todo:
                pid = todo.pop()
                self.descendants.add(pid)
                todo += child_pids(pid)
        self.samples.append(sample)

    # -- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        """Close the feeds, give the last events time to arrive, stop everything
        gracefully (SIGCONT first for a stopped peer)."""
        for feed in self.feeds.values():
            feed.close()
        for name, feed in self.feeds.items():  # each sends what it has, then exits
            if name in self.live:
                # The revoked publisher's events are owed to nobody, and roots refuse its
                # links: it would wait half a minute for them before giving up.
                quiet = 5.0 if name == REVOKED_PUBLISHER and self.revoked_at else 30.0
                self._ended(name, time.time(), "stopped", self._drained(feed, quiet))
        time.sleep(self.settings.drain)
        self._sample()
        self._notice_exits()
        self._notice_ready()
        for incarnation in self.live.values():
            if incarnation.paused:
                os.kill(incarnation.pid, signal.SIGCONT)
        assert self.cluster is not None
        processes = self._processes()
        self.cluster.stop_all(timeout=20)
        # Read once no peer can enrol any more (a rollover's renewals would be missing).
        self.audit_log = self._read_audit()
        if self.keyserver is not None:
            stop(self.keyserver)
        now = time.time()
        for name in list(self.live):
            self._ended(name, now, "stopped", processes[name].returncode)

    def leftovers(self, grace: float = 10.0) -> list[int]:
        """Processes this run started (or theirs started) still running ``grace`` seconds
        after the end (a killed key server's workers notice within a second, and exit)."""
        pids = {i.pid for i in self.incarnations} | self.descendants
        deadline = time.monotonic() + grace
        while True:
            left = sorted(p for p in pids if rss_bytes(p) and _not_zombie(p))
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def _drained(self, feed: _Feed, quiet: float = 30.0) -> int | None:
        """Wait for a publisher to send what it was fed and exit, as long as it keeps
        sending (one behind its feed catches up); killed after ``quiet`` seconds without
        progress. Its exit status."""
        assert self.cluster is not None
        process, sent = feed.peer.process, self.cluster.workdir / f"{feed.peer.name}.sent.jsonl"
        progress_at, size = time.monotonic(), -1
        while process.poll() is None and time.monotonic() - progress_at < quiet:
            now_size = sent.stat().st_size if sent.exists() else 0
            if now_size != size:
                progress_at, size = time.monotonic(), now_size
            time.sleep(0.5)
        if process.poll() is None:
            process.kill()
        return process.wait()

    def _read_audit(self) -> list[dict[str, Any]]:
        """The key server's whole audit log, from the running server."""
        token = (self.data / "admin.token").read_text().strip()
        entries: list[dict[str, Any]] = []
        with KeyServerClient(self.url, token) as admin:
            while True:
                batch = admin.audit(after=entries[-1]["id"] if entries else 0, limit=1000)
                entries += batch
                if len(batch) < 1000:
                    return entries

    def _client_answers(self) -> dict[str, dict[str, int]]:
        """Per identity, how many answers of each enrolment route and status its processes
        saw (from their logs: each process logs every request at ``-v``), e.g.
        ``{"sub-03": {"subscriber 200": 5, "transport 200": 5}}``."""
        assert self.cluster is not None
        return {name: _count_matches(self.cluster.workdir / f"{name}.log", ENROL_ANSWER)
                for name in self.tokens}

    def _server_errors(self) -> dict[str, int]:
        """The key server's answers with a 5xx status, per method, route and status, from
        its access log (e.g. ``{"POST /v1/directory 500": 398}``)."""
        return _count_matches(self.workdir / "keyserver.log", SERVER_ERROR)

    def record(self) -> dict[str, Any]:
        """What the oracle needs, as JSON-able data."""
        assert self.cluster is not None
        sent: dict[str, dict[str, Any]] = {}
        for name, feed in self.feeds.items():
            times = self.cluster.sent_times(name)
            for event_id, values in feed.values.items():
                if event_id in times:
                    sent[event_id] = {"publisher": name, "values": values,
                                      "sent_at": times[event_id]}
        deliveries = {name: [(d["id"], d.get("delivered_at")) for d in
                             self.cluster.peers[name].delivered()]
                      for name in self.subscriptions}
        return {"started": self.started, "settings": asdict(self.settings),
                "subscriptions": self.subscriptions, "routing": self.routing,
                "incarnations": [asdict(i) for i in self.incarnations],
                "faults": self.done_faults, "sent": sent, "deliveries": deliveries,
                "samples": self.samples, "revoked_at": self.revoked_at,
                "revoked_epoch": self.revoked_epoch,
                "audit": self.audit_log, "client_answers": self._client_answers(),
                "server_errors": self._server_errors(),
                "links": {name: read_links(self.cluster.workdir / f"{name}.log")
                          for name in self.subscriptions},
                "fed": {name: len(feed.values) for name, feed in self.feeds.items()},
                "revoked_publisher": REVOKED_PUBLISHER, "network": self._network_record()}

    def _network_record(self) -> dict[str, Any]:
        if self.network is None:
            return {"skipped": self.network_skipped}
        s = self.settings
        return {"group": self.group, "core_address": CORE_ADDRESS,
                "group_address": GROUP_ADDRESS, "delay_ms_each_way": s.link_delay_ms,
                "loss": s.link_loss, "partition_seconds": s.partition_seconds,
                "emulator_running": self.network.emulator_running,
                "link_log": self.network.log.read_text(errors="replace").splitlines()}


SERVER_ERROR = re.compile(r'"([A-Z]+) ([^ ?"]+)[^"]* HTTP/[\d.]+" (5\d\d)')
ENROL_ANSWER = re.compile(
    r'HTTP Request: POST \S+/v1/enrol/(subscriber|publisher|root|transport) "HTTP/[\d.]+ (\d+)')


def _count_matches(log: Path, pattern: re.Pattern[str]) -> dict[str, int]:
    """How often each match of ``pattern`` occurs in ``log``, keyed by its groups joined
    with spaces (nothing if the log does not exist)."""
    if not log.exists():
        return {}
    return dict(Counter(" ".join(m.groups()) for m in pattern.finditer(
        log.read_text(errors="replace"))))


def _not_zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def soak_network(settings: SoakSettings, workdir: Path, progress: Callable[[str], None],
                 outside: str | None = None) -> Iterator[tuple[SplitNetwork | None, str | None]]:
    """The namespaces of the subscriber group (entered for the run, torn down after it),
    or None and why the run goes without them: not root, no group asked for, or
    ``outside``, a reason the run needs the machine's own network (a database elsewhere)."""
    reason = ("no subscriber group asked for" if not settings.group
              else outside or unavailable())
    network = None
    if reason is None:
        network = SplitNetwork(settings.link_delay_ms, settings.link_loss, settings.seed,
                               workdir / "link.log")
        try:
            network.open()
        except OSError as exc:  # root without the capabilities, a kernel without NFQUEUE
            network, reason = None, f"they could not be built: {exc}"
    if network is None:
        progress(f"soak: no network namespaces: {reason}")
        yield None, reason
        return
    try:
        progress(f"soak: {settings.group} subscribers in the namespace {network.group} "
                 f"({GROUP_ADDRESS}), the rest in {network.core} ({CORE_ADDRESS}); the link "
                 f"between them: {settings.link_delay_ms:g} ms each way, "
                 f"{settings.link_loss:.0%} loss")
        yield network, None
    finally:
        network.close()


def run_soak(settings: SoakSettings, workdir: Path, progress: Callable[[str], None] = print,
             database_url: str | None = None, network: SplitNetwork | None = None,
             network_skipped: str | None = None) -> dict[str, Any]:
    """One soak run in ``workdir`` (kept: every process's log is there) and the oracle's
    verdict, with the key server on ``database_url`` (None: SQLite in its directory) and
    the subscriber group in ``network`` (from :func:`soak_network`); every process is
    stopped on the way out, whatever happens."""
    from ibe_pubsub.evaluation.soak_oracle import analyse, passed

    run = SoakRun(settings, workdir, progress, database_url, network, network_skipped)
    try:
        run.start()
        run.run()
        run.finish()
    finally:
        if run.cluster is not None:
            run.cluster.stop_all(timeout=5)
        if run.keyserver is not None:
            stop(run.keyserver)
    record = run.record()
    verdict = analyse(record, run.leftovers())
    (workdir / "record.json").write_text(json.dumps(record))
    return {"benchmark": "soak", "settings": asdict(settings), "workdir": str(workdir),
            "database": "postgresql" if database_url else "sqlite",
            "network": record["network"],
            "passed": passed(verdict), "verdict": verdict}
