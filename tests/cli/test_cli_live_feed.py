"""Live feeds through the CLI, with real processes: `publish --events -` reading a pipe line by
line across an epoch rollover, bad lines skipped or stopping the run, the --rate schedule,
and a subscriber delivering to a command and to the readers of a Unix socket.

One overlay for the module (a key server with 10 s epochs, one root process for the three
trees, one subscriber of everything that also delivers to a socket and a command), so each
test pays only for its own processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from keyserver_fixtures import rooted_cluster

from ibe_pubsub.cli.delivery_sinks import CommandSink, Failure, SinkError, _listening_socket
from ibe_pubsub.cli.event_feed import BACKLOG, BACKLOG_BYTES, EventFeed, Schedule
from ibe_pubsub.credentials import parse_predicate, resolve_schema
from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.peer import read_deliveries, read_events
from ibe_pubsub.peer.events_io import MAX_BODY, MAX_LINE

pytestmark = pytest.mark.timeout(120)

#: Epochs short enough to cross a rollover in a test (seconds; the grace window after each).
EPOCH, GRACE = 10, 4


#: The subscriber's --deliver-buffer: small, for a reader that stops reading to be dropped
#: after a dozen deliveries of BIG_BODY (with what the kernel buffers).
BUFFER, BIG_BODY = 16384, 4000


@dataclass(frozen=True)
class Overlay:
    cluster: Cluster
    subscriber: PeerProcess
    socket: Path
    command_out: Path


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlay]:
    epochs = ("--epoch-seconds", str(EPOCH), "--grace-seconds", str(GRACE))
    with rooted_cluster(tmp_path_factory.mktemp("live-feed"), epochs) as (_, cluster, _):
        # A socket path short enough for AF_UNIX (at most 107 bytes).
        sock = Path(f"/tmp/ibe-live-feed-{os.getpid()}.sock")
        command_out = cluster.workdir / "command.jsonl"
        sub = cluster.start_subscriber("sub", "", extra=(
            "--deliver-to-socket", str(sock), "--deliver-buffer", str(BUFFER),
            "--deliver-to-command", f"cat > {command_out}"))
        cluster.wait_ready([sub])
        yield Overlay(cluster, sub, sock, command_out)


def quote(event_id: str, price: float = 10.0, body: str = "") -> str:
    return json.dumps({"id": event_id, "body": body,
                       "values": {"symbol": "IBM", "price": price, "volume": 1}}) + "\n"


@dataclass
class LivePublisher:
    """A real `ibe-pubsub publish --events -` process, fed through a pipe by the test."""

    process: subprocess.Popen[str]
    sent_out: Path

    @classmethod
    def start(cls, overlay: Overlay, name: str, *options: str) -> LivePublisher:
        cluster = overlay.cluster
        token = cluster.identity(name, "publisher")
        sent_out = cluster.workdir / f"{name}.sent.jsonl"
        env = child_env() | {
            "IBE_PUBSUB_TOKEN": token,
            "IBE_PUBSUB_KNOWN_SERVERS": str(cluster.workdir / "known_servers.json"),
            "IBE_PUBSUB_PUBLISHED_IDS": str(cluster.workdir / "published_ids.json")}
        process = subprocess.Popen(
            cli_command("publish", "--server", cluster.server, "--advertise", "price < 500",
                        "--events", "-", "--sent-out", str(sent_out), *options),
            env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        return cls(process, sent_out)

    def write(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def sent_at(self) -> dict[str, float]:
        """When each event was sent, by id, in the order sent."""
        return {d["id"]: d["sent_at"] for d in read_deliveries(self.sent_out)}

    def sent(self) -> list[str]:
        return list(self.sent_at())

    def wait_sent(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` events were sent, while the process runs."""
        deadline = time.monotonic() + timeout
        while len(self.sent()) < count:
            assert self.process.poll() is None, self.process.communicate()[1]
            assert time.monotonic() < deadline, f"{self.sent()} sent"
            time.sleep(0.05)

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """Close its stdin and wait for it: (status, stderr)."""
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err


def delivered(overlay: Overlay, expected: set[str], unexpected: frozenset[str] = frozenset()
              ) -> set[str]:
    """Of ``expected`` and ``unexpected``, those the subscriber delivered once the expected
    came (or 30 s passed) and half a second more for the unexpected, sent before them."""
    overlay.cluster.wait_deliveries({"sub": expected}, settle=0.5)
    return {d["id"] for d in overlay.subscriber.delivered()} & (expected | unexpected)


def test_a_live_feed_on_stdin_goes_on_across_an_epoch_rollover(overlay):
    publisher = LivePublisher.start(overlay, "feed", "--stream-window", "1s")
    publisher.write(quote("live-0"))
    publisher.wait_sent(1)  # sent while the pipe is still open: read as lines arrive
    epoch = overlay.cluster.admin.epoch()
    ids = ["live-0"]
    # Slowly, until the publisher must have renewed its keys (the first event after the
    # rollover) and a little more.
    while time.time() < epoch["epoch_end"] + 1.5:
        ids.append(f"live-{len(ids)}")
        publisher.write(quote(ids[-1]))
        time.sleep(0.3)
    status, err = publisher.finish()
    assert status == 0, err
    assert f"sent {len(ids)} event(s) as a stream to the roots of price, symbol, volume" in err
    sent_at = publisher.sent_at()
    assert min(sent_at.values()) < epoch["epoch_end"] < max(sent_at.values())
    assert delivered(overlay, set(ids)) == set(ids), overlay.subscriber.log_tail()


def test_a_delivery_command_that_exits_stops_the_peer_with_one_line(overlay):
    # Right after the rollover test, early in an epoch: a peer joining just before a
    # rollover of these short epochs can miss events until the next one.
    cluster = overlay.cluster
    quitter = cluster.start_subscriber("quitter", 'symbol = "QUIT"', extra=(
        "--deliver-to-command", "read line; exit 3"))
    cluster.wait_ready([quitter])
    publisher = LivePublisher.start(overlay, "to-quitter")
    sent = 0
    deadline = time.monotonic() + 30
    while quitter.process.poll() is None:  # until it delivered one (and its command read it)
        assert time.monotonic() < deadline, quitter.log_tail()
        sent += 1
        publisher.write(json.dumps({"id": f"quit-{sent}", "values": {
            "symbol": "QUIT", "price": 1.0, "volume": 1}}) + "\n")
        time.sleep(0.3)
    assert publisher.finish()[0] == 0
    assert quitter.process.returncode == 2
    assert quitter.log_tail(1) == (
        "ibe-pubsub: error: the delivery command 'read line; exit 3' exited with status 3")
    assert quitter.delivered()  # and --events-out was written as well


def test_a_bad_line_is_reported_and_skipped_or_stops_the_run(overlay):
    publisher = LivePublisher.start(overlay, "skipper")
    publisher.write(quote("skip-1") + quote("skip-2"))
    publisher.wait_sent(2)
    publisher.write("{not json\n" + quote("skip-4", price=900.0) + quote("skip-5"))
    status, err = publisher.finish()
    assert status == 0, err
    assert "ibe-pubsub: skipped <stdin>:3: not JSON: " in err
    assert ("ibe-pubsub: skipped <stdin>:4: event 'skip-4' lies outside the advertisement "
            "price < 500") in err
    assert "sent 3 event(s) to the roots of price, symbol, volume; skipped 2 bad line(s)" in err
    good = {"skip-1", "skip-2", "skip-5"}
    assert delivered(overlay, good, frozenset({"skip-4"})) == good

    stopper = LivePublisher.start(overlay, "stopper", "--on-bad-line", "stop")
    stopper.write(quote("stop-1"))
    stopper.wait_sent(1)
    stopper.write('{"id": "stop-2"}\n' + quote("stop-3"))
    status, err = stopper.finish()
    assert status == 2
    assert err.splitlines()[-1] == ("ibe-pubsub: error: <stdin>:2: 'values' must be an "
                                    "object (1 sent before)")
    assert stopper.sent() == ["stop-1"]
    assert delivered(overlay, {"stop-1"}, frozenset({"stop-3"})) == {"stop-1"}


@pytest.mark.serial  # a rate measured in wall time: not beside another test process
def test_rate_is_kept_by_a_schedule(overlay):
    count, rate = 40, 20
    # Streamed, so that encrypting an event takes a few milliseconds even on a busy machine:
    # the test measures the pacing, not the pairings.
    publisher = LivePublisher.start(overlay, "paced", "--rate", str(rate),
                                    "--stream-window", "10s")
    publisher.write("".join(quote(f"paced-{i}") for i in range(count)))
    status, err = publisher.finish()
    assert status == 0, err
    times = list(publisher.sent_at().values())
    assert len(times) == count
    # (count - 1) / rate = 1.95 s on schedule; sleeping after each send would take far longer
    assert 1.8 < times[-1] - times[0] < 2.5, times[-1] - times[0]
    assert delivered(overlay, {f"paced-{i}" for i in range(count)}) == {
        f"paced-{i}" for i in range(count)}


def test_the_schedule_catches_up_a_short_lag_and_forgives_a_long_one():
    schedule = Schedule(0.05)
    clock, sent = 100.0, []
    for k in range(60):
        clock += schedule.delay(clock)
        sent.append(clock)
        clock += 0.03 if k not in (10, 30) else (0.4 if k == 10 else 3.0)  # the work
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(sent)]
    assert gaps[:10] == [0.05] * 10  # on schedule while the work takes less than a period
    # 0.4 s late: the next events go at once (0.03 s apart) until the schedule is met again
    # (0.35 s behind, made up at 0.02 s an event)
    assert gaps[10] == 0.4 and set(gaps[11:27]) == {0.03} and gaps[29] == 0.05
    assert sent[29] - sent[0] == pytest.approx(29 * 0.05)
    # 3 s late (a stall, a pause of the input): no burst after it, the schedule restarts
    assert gaps[30] == 3.0 and gaps[31:] == [0.05] * 28


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class SocketReader:
    """A reader of the subscriber's socket that reads all the time, in a thread."""

    def __init__(self, path: Path) -> None:
        self.connection = socket.socket(socket.AF_UNIX)
        self.connection.connect(str(path))
        self.data = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while chunk := self.connection.recv(65536):
            self.data += chunk

    def ids(self) -> list[str]:
        return [json.loads(line)["id"] for line in self.data.splitlines(keepends=True)
                if line.endswith(b"\n")]


#: A Python another user may run (this environment's may lie under a private home).
SYSTEM_PYTHON = "/usr/bin/python3"


def _connects_as_nobody(path: Path) -> bool:
    """Whether another user (uid 65534) can connect to the socket at ``path``."""
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(3)\n")
    done = subprocess.run([SYSTEM_PYTHON, "-c", probe, str(path)], check=False,
                          preexec_fn=lambda: os.setuid(65534), capture_output=True)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                    reason="needs root and /usr/bin/python3 to try the socket as another user")
def test_another_user_cannot_read_the_delivery_socket(overlay):
    assert not _connects_as_nobody(overlay.socket)
    mode = overlay.socket.stat().st_mode
    overlay.socket.chmod(0o666)  # control: the same attempt reaches a socket open to all
    try:
        assert _connects_as_nobody(overlay.socket)
    finally:
        overlay.socket.chmod(mode)


def test_deliveries_go_to_a_command_and_to_socket_readers_a_stalled_one_dropped(overlay):
    fast = SocketReader(overlay.socket)
    stalled = socket.socket(socket.AF_UNIX)  # connects and never reads
    stalled.connect(str(overlay.socket))
    time.sleep(0.2)  # both accepted before the first delivery
    ids = [f"big-{i}" for i in range(30)]
    # paced, so that the reading reader keeps up even on a busy machine
    publisher = LivePublisher.start(overlay, "big", "--stream-window", "10s", "--rate", "40")
    publisher.write("".join(quote(i, body="x" * BIG_BODY) for i in ids))
    status, err = publisher.finish()
    assert status == 0, err
    assert delivered(overlay, set(ids)) == set(ids), overlay.subscriber.log_tail()
    # the stalled reader held up neither the peer nor the other reader, nor the command
    wait_until(lambda: len(fast.ids()) >= len(ids), "the reading reader")
    assert fast.ids() == ids
    wait_until(lambda: ids[-1] in overlay.command_out.read_text(), "the command")
    log = overlay.subscriber.log_file.read_text()
    assert (f"dropped a reader of the socket {overlay.socket}: more than {BUFFER} bytes of "
            "deliveries unread") in log
    stalled.settimeout(10)
    received = b""
    while chunk := stalled.recv(65536):  # what was buffered for it, then the end
        received += chunk
    assert 0 < received.count(b"\n") < len(ids)
    command = [json.loads(line)["id"] for line in overlay.command_out.read_text().splitlines()]
    assert ids == [i for i in command if i.startswith("big-")]
    assert overlay.subscriber.process.poll() is None


def test_sigterm_ends_a_live_feed_after_flushing(overlay):
    publisher = LivePublisher.start(overlay, "terminated")
    publisher.write(quote("term-1") + quote("term-2"))
    publisher.wait_sent(2)
    publisher.process.send_signal(signal.SIGTERM)  # its stdin still open
    status, err = publisher.finish()
    assert status == 0, err
    assert "sent 2 event(s) to the roots of price, symbol, volume" in err
    assert delivered(overlay, {"term-1", "term-2"}) == {"term-1", "term-2"}


def test_pacing_and_bad_line_options_are_checked_from_flags_and_the_configuration_file(
        tmp_path):
    base = ("publish", "--server", "http://127.0.0.1:9", "--token", "t", "--advertise", "",
            "--events", "-")

    def refused(*args: str) -> str:
        done = subprocess.run(cli_command(*args), capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr
        return done.stderr.strip().splitlines()[-1]

    assert "--rate: must be a positive number, got 0" in refused(*base, "--rate", "0")
    assert "not allowed with argument" in refused(*base, "--rate", "5", "--interval", "1")
    config = tmp_path / "ibe-pubsub.toml"
    config.write_text('[publish]\nrate = 100\n')
    assert refused("--config", str(config), *base, "--interval", "1") == (
        "ibe-pubsub: error: give --rate or --interval, not both (one may come from the "
        "configuration file or the environment)")
    config.write_text('[publish]\non-bad-line = "ignore"\n')
    assert refused("--config", str(config), *base) == (
        "ibe-pubsub: error: [publish] on_bad_line: expected one of stop, skip, got 'ignore'")


# -- The reader of a feed and the delivery sinks on their own, without an overlay ------------

STOCKS = resolve_schema("stocks")
EVERYTHING = parse_predicate(STOCKS, "")


def bad_lines(path: Path) -> tuple[list[str], list[str]]:
    """(ids read, errors) of the file read as a feed that skips bad lines."""
    errors: list[str] = []
    events = read_events(str(path), STOCKS, EVERYTHING,
                         bad=lambda exc: errors.append(str(exc)))
    return [e.event_id for e in events], errors


def test_a_line_nested_too_deeply_or_too_large_is_a_bad_line_and_the_next_is_read(tmp_path):
    feed = tmp_path / "feed.jsonl"
    with feed.open("w") as out:
        out.write("[" * 200_000 + "\n")
        out.write(quote("big", body="x" * (MAX_BODY + 1)))
        out.write("y" * (MAX_LINE + 10) + "\n")  # read past in chunks, never held whole
        out.write(quote("ok"))
    ids, errors = bad_lines(feed)
    assert ids == ["ok"]
    assert errors == [
        f"{feed}:1: not JSON: nested too deeply",
        f"{feed}:2: body of {MAX_BODY + 1} bytes exceeds the limit of {MAX_BODY} (an "
        "encrypted event must fit one overlay message)",
        f"{feed}:3: {MAX_LINE + 11} bytes, longer than the limit of {MAX_LINE} (an "
        "encrypted event must fit one overlay message)"]


def test_a_feed_reads_ahead_no_more_than_its_byte_budget_of_bodies(tmp_path):
    body = "x" * (1 << 20)
    feed_file = tmp_path / "big.jsonl"
    feed_file.write_text("".join(quote(f"big-{n}", body=body) for n in range(40)))

    async def run() -> tuple[int, int]:
        feed = EventFeed(str(feed_file), STOCKS, EVERYTHING, skip_bad=True)
        await asyncio.sleep(1.0)  # nothing taken: the reader stops at the budget
        ahead = feed.unsent
        for _ in range(40):
            assert await feed.next(asyncio.Event()) is not None
        return ahead, feed.unsent

    ahead, left = asyncio.run(run())
    assert ahead == BACKLOG_BYTES // (1 << 20) and left == 0  # 40 without the byte budget


def test_a_stopped_feed_counts_the_lines_read_ahead_and_its_reader_ends_quietly(
        tmp_path, monkeypatch):
    feed_file = tmp_path / "feed.jsonl"
    feed_file.write_text("".join(quote(f"ahead-{n}") for n in range(BACKLOG + 50)))
    failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)

    async def run() -> EventFeed:
        feed = EventFeed(str(feed_file), STOCKS, EVERYTHING, skip_bad=True)
        stop = asyncio.Event()
        assert await feed.next(stop) is not None
        while feed.unsent < BACKLOG + 1:  # the queue full again, and one more on its way
            await asyncio.sleep(0.01)
        stop.set()
        assert await feed.next(stop) is None
        return feed  # the loop ends with the reader waiting to queue a line

    feed = asyncio.run(run())
    feed.reader.join(5)
    assert not feed.reader.is_alive()
    assert failures == []
    assert feed.unsent == BACKLOG + 1


def test_a_delivery_command_that_closes_its_input_fails_the_deliveries_at_once(caplog):
    async def run() -> str | None:
        sink = CommandSink("exec 0<&-; sleep 30")
        failure = Failure()
        await sink.start(failure)
        await asyncio.wait_for(failure.event.wait(), 5)
        for _ in range(10):  # no "pipe closed by peer" warning per delivery
            sink.write_line("{}\n")
        assert sink._process is not None
        sink._process.kill()
        await sink.close()
        return failure.why

    assert asyncio.run(run()) == (
        "the delivery command 'exec 0<&-; sleep 30' closed its input (broken pipe)")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_delivery_socket_at_a_symbolic_link_is_refused_as_one(tmp_path):
    target = tmp_path / "real.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(target))
        (tmp_path / "link.sock").symlink_to(target)
        with pytest.raises(SinkError, match="is a symbolic link: give the socket's "
                                             "own path"):
            _listening_socket(tmp_path / "link.sock")


def test_a_live_feed_that_fails_while_its_input_is_open_exits_with_its_error(
        keyserver_factory):
    """The reader thread waits in a read of stdin when the run ends on an error (here: no
    root registers in time); the interpreter must still shut down cleanly, with the error
    and status 2, not abort on the lock that read holds (it did, with status -6, when a
    revoked publisher's feed ended at a rollover)."""
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, keyserver_factory.root / "peers")
    try:
        process = subprocess.Popen(
            cli_command("publish", "--server", server.base_url, "--advertise", "",
                        "--events", "-", "--root-timeout", "1"),
            env=child_env() | {"IBE_PUBSUB_TOKEN": cluster.identity("lonely", "publisher")},
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert process.stdin is not None and process.stderr is not None
        try:
            process.wait(60)  # stdin stays open: the reader is blocked in its read
        finally:
            process.stdin.close()
        err = process.stderr.read().decode()
    finally:
        cluster.stop_all()
    assert process.returncode == 2, err
    assert "no root registered" in err and "Fatal Python error" not in err, err
