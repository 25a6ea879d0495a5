"""Bundles of `bulk issue` in use, with a real key server, real `bulk decompose`/`bulk issue`
runs and real peer processes: `peer run --bundle` and `publish --bundle` deliver exactly the
matching events; a bulk-created identity's token cannot enrol; bad bundles (altered, of
another server or role, with another identity's token, without a token) are refused in one
line before anything is certified; a holder takes the next epoch's bundle from its file, or
stops when its keys expire without one; `bulk issue` does not resume a run of a past epoch."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from keyserver_fixtures import KeyServer, KeyServers

from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError
from ibe_pubsub.peer.events_io import event_line
from ibe_pubsub.pipelines.issue import IssueError, IssueOptions, issue_bulk

pytestmark = pytest.mark.timeout(300)

ATTRIBUTES = ["symbol", "price", "volume"]
#: identity, role, predicate: two identities bulk issuance creates, one that exists before.
REQUESTS = [("b-sub", "subscriber", 'symbol prefix "IB" and price < 100'),
            ("b-pub", "publisher", "price < 500"),
            ("e-sub", "subscriber", 'symbol = "IBM"')]
E_SUB_POLICY = 'symbol prefix "IB"'
#: e-sub runs with its bundle narrowed to this.
E_SUB_NARROWED = 'symbol = "IBM" and volume >= 1000'
EVENTS = [Event("both", {"symbol": "IBM", "price": 50.0, "volume": 2000}),
          Event("e-only", {"symbol": "IBM", "price": 150.0, "volume": 2000}),
          Event("b-only", {"symbol": "IBX", "price": 50.0, "volume": 2000}),
          Event("small", {"symbol": "IBM", "price": 50.0, "volume": 10}),
          Event("nobody", {"symbol": "MSFT", "price": 50.0, "volume": 5000})]
EXPECTED = {"b-sub": {"both", "b-only", "small"}, "e-sub": {"both", "e-only"}}


@dataclass(frozen=True)
class Issued:
    server: KeyServer
    decomposed: Path
    keys: Path
    e_sub_token: str

    def bundle(self, name: str) -> Path:
        return self.keys / f"{name}.json"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), env=env or child_env(), capture_output=True,
                          text=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issued]:
    """A key server of its own and the bundles of REQUESTS, through the two CLI steps."""
    root = tmp_path_factory.mktemp("bundles")
    servers = KeyServers(root / "servers")
    try:
        server = servers.start()
        with KeyServerClient(server.base_url, server.admin_token) as admin:
            token = admin.create_identity("e-sub", "subscriber", E_SUB_POLICY)["token"]
        with (root / "requests.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows([("identity", "role", "predicate"), *REQUESTS])
        decomposed, keys = root / "decomposed", root / "keys"
        done = _cli("bulk", "decompose", "--engine", "python", "--schema", "stocks",
                    "--input", str(root / "requests.csv"), "--output", str(decomposed))
        assert done.returncode == 0, done.stderr
        done = _cli("bulk", "issue", "--server", server.base_url, "--input", str(decomposed),
                    "--output", str(keys),
                    env={**child_env(), "IBE_PUBSUB_ADMIN_TOKEN": server.admin_token})
        assert done.returncode == 0, done.stderr
        yield Issued(server, decomposed, keys, token)
    finally:
        servers.stop_all()


def _events_file(path: Path, events: list[Event]) -> Path:
    path.write_text("".join(json.dumps({k: v for k, v in event_line(e).items()
                                        if k != "delivered_at"}) + "\n" for e in events))
    return path


def test_bundle_holders_deliver_exactly_the_matching_events(issued, tmp_path):
    cluster = Cluster(issued.server.base_url, issued.server.admin_token, tmp_path / "peers",
                      verbose=True)
    try:
        cluster.wait_ready([cluster.start_root("roots", ATTRIBUTES)])
        cluster.wait_ready([
            cluster.start_subscriber("b-sub", None, bundle=issued.bundle("b-sub")),
            cluster.start_subscriber("e-sub", E_SUB_NARROWED, token=issued.e_sub_token,
                                     bundle=issued.bundle("e-sub"))])
        result = cluster.publish("b-pub", EVENTS, None, bundle=issued.bundle("b-pub"))
        assert result.returncode == 0, result.stderr
        cluster.wait_deliveries(EXPECTED, timeout=40)
    finally:
        cluster.stop_all()
    for name, want in EXPECTED.items():
        peer = cluster.peers[name]
        assert {d["id"] for d in peer.delivered()} == want, peer.log_tail()
        assert peer.process.returncode == 0, peer.log_tail()


def test_a_bulk_created_token_cannot_enrol_but_an_added_one_can(issued):
    bulk_token = json.loads(issued.bundle("b-sub").read_text())["token"]
    assert "token" not in json.loads(issued.bundle("e-sub").read_text())
    with KeyServerClient(issued.server.base_url, bulk_token, retries=0) as bulk:
        assert bulk.whoami() == {"name": "b-sub", "role": "subscriber", "bulk_only": True}
        with pytest.raises(KeyServerRequestError) as refused:
            bulk.enrol_subscriber('symbol prefix "IB"')
        assert (refused.value.status, refused.value.code) == (403, "bulk_only")
        assert "--bundle" in str(refused.value)
    with KeyServerClient(issued.server.base_url, issued.e_sub_token, retries=0) as added:
        assert added.whoami()["bulk_only"] is False
        assert added.enrol_subscriber('symbol prefix "IB"')["credentials"]


def _tampered(source: Path, target: Path) -> Path:
    doc = json.loads(source.read_text())
    doc["credentials"]["price"] = ["price:*"]  # claim the whole price domain
    target.write_text(json.dumps(doc))
    return target


def _issued_transport(server: KeyServer, identity: str) -> int:
    with KeyServerClient(server.base_url, server.admin_token) as admin:
        return sum(1 for e in admin.audit(limit=1000)
                   if e["action"] == "issue_transport" and e["detail"]["identity"] == identity)


def test_bad_bundles_are_refused_in_one_line(issued, keyserver, tmp_path):
    """Each refusal against a control that passes the same check: the pristine bundle of the
    publisher with no token given, its own server, e-sub's bundle with e-sub's token and
    narrowed inside its credentials (the end-to-end test runs those)."""
    events = _events_file(tmp_path / "events.jsonl", EVENTS[:1])
    own = issued.server.base_url
    b_pub = ("--bundle", str(issued.bundle("b-pub")))
    cases = [
        (own, ("--bundle", str(_tampered(issued.bundle("b-pub"), tmp_path / "tampered.json"))),
         None, "was altered since it was issued"),
        (keyserver.base_url, b_pub, None, "another key server issued it"),
        (own, ("--bundle", str(issued.bundle("b-sub"))), None,
         "holds subscriber keys: use it with `ibe-pubsub peer run --bundle`"),
        (own, b_pub, issued.e_sub_token,
         "is for identity 'b-pub', but the token belongs to 'e-sub'"),
        (own, ("--bundle", str(issued.bundle("e-sub"))), None, "carries no token"),
        (own, ("--bundle", str(tmp_path / "missing.json")), None, "cannot read it"),
        (own, (*b_pub, "--advertise", "price < 900"), None,
         "--advertise 'price < 900' selects events outside the bundle's credentials"),
    ]
    certified = _issued_transport(issued.server, "e-sub")
    for server, options, token, message in cases:
        env = {k: v for k, v in child_env().items() if k != "IBE_PUBSUB_TOKEN"}
        if token is not None:
            env["IBE_PUBSUB_TOKEN"] = token
        done = _cli("publish", "--server", server, *options, "--events", str(events),
                    "--root-timeout", "0", env=env)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2 and last.startswith("ibe-pubsub: error: "), done.stderr
        assert message in last and "Traceback" not in done.stderr, (message, done.stderr)
    # the foreign token was refused before anything was certified for its identity
    assert _issued_transport(issued.server, "e-sub") == certified


GRACE = 4


def _fresh_epoch(admin: KeyServerClient, room: float) -> float:
    """Wait, if need be, for an epoch with ``room`` seconds left; its end."""
    end = admin.epoch()["epoch_end"]
    if end - time.time() < room:
        time.sleep(max(0.0, end - time.time()) + 0.3)
        end = admin.epoch()["epoch_end"]
    return end


def test_a_holder_takes_the_next_bundle_or_stops_when_its_keys_expire(issued, keyserver_factory,
                                                                      tmp_path):
    # 20 s epochs: issuing and starting three peers must end before the grace window, with
    # room to spare on a slow, busy machine.
    server = keyserver_factory.start(init_args=("--epoch-seconds", "20",
                                                "--grace-seconds", str(GRACE)))
    admin = KeyServerClient(server.base_url, server.admin_token)
    keys, later = tmp_path / "keys", tmp_path / "keys-next"
    end = _fresh_epoch(admin, room=14)
    issue_bulk(admin, issued.decomposed, keys, IssueOptions())
    cluster = Cluster(server.base_url, server.admin_token, tmp_path / "peers")
    try:
        cluster.wait_ready([cluster.start_root("roots", ATTRIBUTES)])
        cluster.wait_ready([cluster.start_subscriber("renewed", None, bundle=keys / "b-sub.json"),
                            cluster.start_subscriber("stale", None, bundle=keys / "e-sub.json")])
        assert time.time() < end - GRACE, "the peers started after the grace window began"
        time.sleep(max(0.0, end - GRACE + 0.5 - time.time()))
        issue_bulk(admin, issued.decomposed, later, IssueOptions(epoch="next"))
        shutil.copyfile(later / "b-sub.json", keys / "b-sub.json.new")
        (keys / "b-sub.json.new").replace(keys / "b-sub.json")
        time.sleep(max(0.0, end + 0.5 - time.time()))
        with pytest.raises(IssueError, match=r"holds bundles of epoch .* new output directory"):
            issue_bulk(admin, issued.decomposed, keys, IssueOptions())  # a stale run's KEYDIR
        result = cluster.publish("pub", EVENTS[:1])
        assert result.returncode == 0, result.stderr
        cluster.wait_deliveries({"renewed": {"both"}}, timeout=20)
        stale = cluster.peers["stale"]
        stale.process.wait(timeout=max(1.0, end + GRACE + 10 - time.time()))
    finally:
        cluster.stop_all()
        admin.close()
    renewed = cluster.peers["renewed"]
    assert {d["id"] for d in renewed.delivered()} == {"both"}, renewed.log_tail()
    assert renewed.process.returncode == 0, renewed.log_tail()
    assert stale.process.returncode == 2, stale.log_tail()
    log = stale.log_file.read_text()
    assert "not yet those of epoch" in log and "put the next epoch's bundle there" in log, log
    assert log.strip().splitlines()[-1].startswith("ibe-pubsub: error: the keys of epoch ")
    assert "expired at" in log.strip().splitlines()[-1]
