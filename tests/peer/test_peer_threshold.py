"""Peers on a threshold deployment (3 of 5): a root, subscribers and a publisher run as real
`ibe-pubsub` processes with `--threshold-file threshold.json --threshold-access FILE` instead of
`--server`, over mutual TLS whose certificates a quorum of members signed. Their keys are
combined from whichever members answer; with a member killed, new peers still enrol and
join, and with two killed, delivery stays exact."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from repository import REPO_ROOT
from threshold_members import n, t, threshold_identity

from ibe_pubsub.evaluation.cluster import PeerProcess
from ibe_pubsub.evaluation.launcher import child_env, cli_command, stop
from ibe_pubsub.keyserver import (
    UNREACHABLE,
    Failure,
    KeyServerRequestError,
    ThresholdEnrolmentError,
)
from ibe_pubsub.keyserver.threshold_directory import merge_listings, read_listing
from ibe_pubsub.peer import ThresholdAccess, ThresholdDeployment
from ibe_pubsub.peer.threshold_service import request_error, well_listed

EXAMPLES = REPO_ROOT / "docs" / "examples"
SUBSCRIPTIONS = {"alice": 'symbol = "IBM"', "bob": "price >= 200", "carol": "volume >= 1000"}
EXPECTED = {"alice": lambda v: v["symbol"] == "IBM", "bob": lambda v: v["price"] >= 200,
            "carol": lambda v: v["volume"] >= 1000}
COMBINED = re.compile(r"(subscriber keys of epoch \d+|root certificate of '\w+'|publisher keys "
                      r"of epoch \d+|link certificate) combined from members \[(\d), (\d), (\d)"
                      r"(?:, (\d))?\]")


def events(count: int) -> list[dict]:
    symbols = ("IBM", "AAPL", "MSFT")
    return [{"id": f"thr-{i}", "values": {"symbol": symbols[i % 3], "price": 50.0 + 13 * i,
                                          "volume": 400 * (i % 5)}, "body": f"event {i}"}
            for i in range(count)]


class Peers:
    """Peer processes of one overlay, each with its own access file."""

    def __init__(self, deployment, workdir: Path) -> None:
        self.deployment, self.workdir = deployment, workdir
        self.document = str(deployment.dirs[0] / "threshold.json")
        self.peers: dict[str, PeerProcess] = {}

    def identity(self, name: str, role: str) -> Path:
        """``name`` registered at every member with one command; its access file."""
        access = self.workdir / f"{name}.access.json"
        added = threshold_identity(self.deployment, "add", f"thr-{name}", range(1, n + 1),
                                   "--role", role, "--access-file", str(access))
        assert added.returncode == 0, added.stderr
        return access

    def key_options(self, access: Path) -> list[str]:
        return ["--threshold-file", self.document, "--threshold-access", str(access)]

    def start(self, name: str, access: Path, *options: str) -> PeerProcess:
        base = self.workdir / name
        log = (self.workdir / f"{name}.log").open("ab")
        command = cli_command("-v", "peer", "run", *self.key_options(access),
                              "--listen", "127.0.0.1:0", "--ready-file", f"{base}.ready.json",
                              "--stats-out", f"{base}.stats.json", *options)
        try:
            process = subprocess.Popen(command, env=child_env(), stdout=subprocess.DEVNULL,
                                       stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        peer = self.peers[name] = PeerProcess(name, "peer", process, self.workdir)
        return peer

    def subscriber(self, name: str, access: Path, *options: str) -> PeerProcess:
        return self.start(name, access, "--subscribe", SUBSCRIPTIONS.get(name, ""),
                          "--events-out", str(self.workdir / f"{name}.events.jsonl"),
                          *options)

    def wait_ready(self, *peers: PeerProcess, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for peer in peers:
            while not peer.ready_file.exists():
                assert peer.process.poll() is None, f"{peer.name} exited:\n{peer.log_tail()}"
                assert time.monotonic() < deadline, f"{peer.name} not ready:\n{peer.log_tail()}"
                time.sleep(0.05)

    def combined_from(self, name: str) -> dict[str, list[int]]:
        """What the peer's log says each of its keys was combined from."""
        text = self.peers[name].log_file.read_text(errors="replace")
        return {m[1]: [int(i) for i in m.groups()[1:] if i] for m in COMBINED.finditer(text)}

    def stop_all(self) -> None:
        for peer in self.peers.values():
            stop(peer.process)


def test_the_documented_application_programs_run_on_a_threshold_deployment(deployment,
                                                                            tmp_path):
    """docs/examples' subscriber and publisher, unchanged, on a threshold deployment: the
    application API takes it from IBE_PUBSUB_THRESHOLD_FILE and IBE_PUBSUB_THRESHOLD_ACCESS (as
    `load_options` reads them for `connect`), and the subscriber prints exactly the two
    quotes its subscription matches; the one outside the advertisement is refused."""
    peers = Peers(deployment, tmp_path)
    root = peers.start("api-root", peers.identity("api-root", "root"), "--root", "symbol",
                       "--root", "price", "--root", "volume")
    base = {k: v for k, v in child_env().items() if not k.startswith("IBE_PUBSUB_")}
    base["IBE_PUBSUB_THRESHOLD_FILE"] = peers.document
    try:
        peers.wait_ready(root)
        # Restarted on port 0, the root takes again the address the members certified to it.
        first = json.loads(root.ready_file.read_text())["address"]
        stop(root.process)
        root.ready_file.unlink()
        root = peers.start("api-root", tmp_path / "api-root.access.json", "--root", "symbol",
                           "--root", "price", "--root", "volume")
        peers.wait_ready(root)
        assert json.loads(root.ready_file.read_text())["address"] == first
        errors = tmp_path / "subscriber.err"
        with errors.open("wb") as err:
            subscriber = subprocess.Popen(
                [sys.executable, str(EXAMPLES / "subscribe_sync.py"), "2"],
                env=base | {"IBE_PUBSUB_THRESHOLD_ACCESS": str(peers.identity("api-sub",
                                                                         "subscriber")),
                            "IBE_PUBSUB_SUBSCRIBE": "volume >= 300"},
                stdout=subprocess.PIPE, stderr=err, text=True)
        wait_for(lambda: "subscribed at" in errors.read_text() or subscriber.poll() is not None,
                 "the subscriber to join")
        published = subprocess.run(
            [sys.executable, str(EXAMPLES / "publish_async.py")],
            env=base | {"IBE_PUBSUB_THRESHOLD_ACCESS": str(peers.identity("api-pub", "publisher"))},
            capture_output=True, text=True, timeout=60, check=False)
        assert published.returncode == 0, published.stderr
        assert "outside the advertisement" in published.stderr
        ids = published.stdout.split()
        out, _ = subscriber.communicate(timeout=60)
        assert subscriber.returncode == 0, errors.read_text()
        got = [(d["id"], d["values"]["symbol"]) for d in map(json.loads, out.splitlines())]
        # The quotes with volume >= 300: AAPL (300) and IBM (500), the third and fourth.
        assert sorted(got) == sorted([(ids[2], "AAPL"), (ids[3], "IBM")]), got
    finally:
        peers.stop_all()


def test_peers_on_a_threshold_deployment_deliver_exactly_with_members_down(
        deployment, tmp_path):
    """A root of every tree and two subscribers enrol with all five members up, each key
    combined from t = 3 members and each link certificate signed by a quorum of 4. With
    member 1 killed, a third subscriber still enrols (from three of the other four) and
    joins, and a live publisher enrols; member 2 is killed in the middle of its feed, and
    every subscriber delivers exactly the events it matches. With two members down, a new
    peer cannot get a link certificate (4 signatures needed, 3 members up): it says so and
    exits."""
    peers = Peers(deployment, tmp_path)
    access = {name: peers.identity(name, role) for name, role in (
        ("root", "root"), ("alice", "subscriber"), ("bob", "subscriber"),
        ("carol", "subscriber"), ("dave", "subscriber"), ("ticker", "publisher"))}
    published = events(60)
    try:
        root = peers.start("root", access["root"], "--root", "symbol", "--root", "price",
                           "--root", "volume")
        peers.wait_ready(root)
        first = [peers.subscriber("alice", access["alice"]),
                 peers.subscriber("bob", access["bob"])]
        peers.wait_ready(*first)
        for name in ("root", "alice", "bob"):
            combined = peers.combined_from(name)
            assert len(combined["link certificate"]) == 4, (name, combined)
            keys = {what: members for what, members in combined.items()
                    if what != "link certificate"}
            assert keys and all(len(m) == 3 for m in keys.values()), (name, combined)

        stop(deployment.processes[1])
        carol = peers.subscriber("carol", access["carol"])
        peers.wait_ready(carol)
        carol_keys = peers.combined_from("carol")
        assert carol_keys["link certificate"] == [2, 3, 4, 5], carol_keys
        assert [len(set(m) - {1}) for what, m in carol_keys.items()
                if what.startswith("subscriber")] == [3], carol_keys

        feed = subprocess.Popen(cli_command(
            "-v", "publish", *peers.key_options(access["ticker"]), "--advertise", "",
            "--events", "-"), env=child_env(), stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert feed.stdin is not None
        for event in published[:30]:
            feed.stdin.write(json.dumps(event) + "\n")
        feed.stdin.flush()
        wait_for(lambda: any(d["id"] == "thr-29" for d in peers.peers["bob"].delivered()),
                 "bob to deliver the first half of the feed")
        stop(deployment.processes[2])  # mid-feed: the overlay needs no member to deliver
        for event in published[30:]:
            feed.stdin.write(json.dumps(event) + "\n")
        _, errors = feed.communicate(timeout=120)
        assert feed.returncode == 0, errors

        expected = {name: {e["id"] for e in published if match(e["values"])}
                    for name, match in EXPECTED.items()}
        assert all(expected.values()) and expected["alice"] != expected["bob"]
        wait_for(lambda: all({d["id"] for d in peers.peers[name].delivered()} >= ids
                             for name, ids in expected.items()), "every delivery")
        time.sleep(1.0)  # anything that should not come has had its chance
        for name, ids in expected.items():
            got = [d["id"] for d in peers.peers[name].delivered()]
            assert sorted(got) == sorted(ids), (name, peers.peers[name].log_tail())

        dave = peers.subscriber("dave", access["dave"], "--server-wait", "2")
        assert dave.process.wait(60) != 0
        assert "no 4 members answered" in dave.log_file.read_text(), dave.log_tail()
    finally:
        peers.stop_all()


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# -- what a peer makes of the members' failures and listings -------------------------------

def failed(*failures: Failure) -> ThresholdEnrolmentError:
    error = ThresholdEnrolmentError("no 3 members answered shares that verify and agree")
    error.failures = failures
    return error


@pytest.mark.parametrize(("failures", "needed", "down", "code"), [
    # two members down: waiting for them may help, even beside one that refuses
    ((Failure(1, "unreachable", UNREACHABLE), Failure(2, "unreachable", UNREACHABLE)),
     3, True, None),
    ((Failure(1, "unreachable", UNREACHABLE), Failure(2, "unreachable", UNREACHABLE),
      Failure(3, "revoked", "revoked")), 3, True, "revoked"),
    # control: two down and two refusing leave at most three, fewer than a quorum of four
    ((Failure(1, "unreachable", UNREACHABLE), Failure(2, "unreachable", UNREACHABLE),
      Failure(3, "revoked", "revoked"), Failure(4, "bad share")), 4, False, "revoked"),
    # refusals only: not down; one code shared by all that refused is kept
    ((Failure(1, "taken", "address_taken"), Failure(2, "taken", "address_taken")), 4, False,
     "address_taken"),
    ((Failure(1, "taken", "address_taken"), Failure(2, "forbidden", "forbidden")), 4, False,
     None),
])
def test_too_few_members_is_down_only_while_enough_could_come_back(failures, needed, down,
                                                                      code):
    error = request_error(failed(*failures), members=n, needed=needed)
    assert (error.down, error.code) == (down, code)
    assert str(error).startswith("no 3 members answered")


def listing(roots, members=(), vouched=True):
    return {"attribute": "symbol", "roots": [
        {"address": a, "role": "root", "expires_at": 2e9, "vouched": vouched} for a in roots],
        "members": [{"address": a, "role": "subscriber", "expires_at": 2e9,
                     "vouched": vouched} for a in members]}


def contacts(merged):
    """What a node joins through (peer.node: the vouched entries of both lists)."""
    return {e["address"] for e in merged["roots"] + merged["members"] if e["vouched"]}


def test_roots_fewer_than_t_members_list_are_no_contacts():
    """The attack: one hostile member lists 256 invented roots and 8 members, all vouched;
    the four honest members list the real root and each a sample of real members (listed
    once or twice). The invented roots go; the sampled members stay, a hostile member's
    sample's worth among them."""
    honest = [listing(["10.0.0.1:7000"], [f"10.0.1.{i}:7000", f"10.0.1.{i + 4}:7000"])
              for i in range(1, 5)]
    hostile = listing([f"10.9.{i // 200}.{i % 200}:7000" for i in range(256)],
                      [f"10.8.0.{i}:7000" for i in range(8)])
    merged = merge_listings("symbol", [read_listing("symbol", x, 8)
                                       for x in [*honest, hostile]])
    assert len(contacts(merged)) == 1 + 8 + 256 + 8  # control: every invented one counts
    kept = contacts(well_listed(merged, t))
    assert {a for a in kept if a.startswith("10.9.")} == set()
    assert len(kept) == 1 + 8 + 8 and "10.0.0.1:7000" in kept
    # Where no root reaches t (one member answered), the most listed ones stay.
    alone = merge_listings("symbol", [read_listing("symbol", honest[0], 8)])
    assert contacts(well_listed(alone, t)) == contacts(alone)


def test_closing_ends_a_call_that_waits_for_hung_members(deployment, tmp_path):
    """Members that accept connections and never answer: a call waits (here up to the
    client's 30 s timeout); closing the service, as a stopping peer does, ends it at once
    with a KeyServerRequestError, and later calls are refused the same way."""
    hung = socket.create_server(("127.0.0.1", 0))
    access = tmp_path / "hung.json"
    access.write_text(json.dumps({"format": "ibe-pubsub-threshold-access-v1", "members": [
        {"index": i, "url": f"http://127.0.0.1:{hung.getsockname()[1]}", "token": "x"}
        for i in range(1, n + 1)]}))
    service = ThresholdDeployment(ThresholdAccess(
        str(deployment.dirs[0] / "threshold.json"), str(access)))
    outcome: list[BaseException] = []

    def probe() -> None:
        try:
            service.probe()
        except KeyServerRequestError as exc:
            outcome.append(exc)

    caller = threading.Thread(target=probe)
    try:
        caller.start()
        caller.join(1.5)
        assert caller.is_alive() and not outcome  # control: it waits for the members
        started = time.monotonic()
        service.close()
        caller.join(5.0)
        assert not caller.is_alive() and time.monotonic() - started < 5.0
        assert "was closed" in str(outcome[0])
        with pytest.raises(KeyServerRequestError, match="is closed"):
            service.probe()
    finally:
        service.close()
        hung.close()


@pytest.mark.parametrize(("args", "env", "message"), [
    # the command line's choice replaces the environment's (here: then the token is missing)
    (["--server", "http://127.0.0.1:9"], {"IBE_PUBSUB_THRESHOLD_FILE": "threshold.json"},
     "--token (or IBE_PUBSUB_TOKEN) is required"),
    (["--threshold-file", "missing.json", "--threshold-access", "missing-access.json"],
     {"IBE_PUBSUB_SERVER": "http://127.0.0.1:9"}, "missing.json"),
    # both in one layer
    ([], {"IBE_PUBSUB_SERVER": "http://127.0.0.1:9",
          "IBE_PUBSUB_THRESHOLD_FILE": "threshold.json"}, "not both or neither"),
    (["--threshold-file", "threshold.json"], {}, "needs --threshold-access"),
    (["--threshold-file", "missing.json", "--threshold-access", "missing-access.json"], {},
     "missing.json"),
    (["--threshold-file", "list.json", "--threshold-access", "missing-access.json"], {},
     "is not a ibe-pubsub-threshold-v2 document"),
])
def test_a_wrong_deployment_is_a_clear_error(tmp_path, args, env, message):
    (tmp_path / "list.json").write_text("[]")
    base = {k: v for k, v in child_env().items() if k != "IBE_PUBSUB_TOKEN"}
    done = subprocess.run(cli_command("peer", "run", *args, "--subscribe", ""),
                          env=base | env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
