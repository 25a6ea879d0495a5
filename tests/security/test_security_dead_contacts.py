"""Directory poisoning with dead addresses, end to end: one identity certifies and registers
80 addresses where nothing listens, as the cheapest way to slow every newcomer's join (each
dead contact tried costs a join timeout). The key server certifies only the identity's first
few (its cap) and refuses the others, nobody vouches for them, and a newcomer that prefers
roots and vouched members joins as fast as without the attack. Real key server, real peer
processes."""

from __future__ import annotations

import base64
import json
import socket

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError

pytestmark = pytest.mark.timeout(240)

DEAD = 80
#: The key server's default cap on one identity's live certified addresses.
CAP = 8
#: Seconds a newcomer's join may exceed the slowest unattacked join: less than the join
#: timeout (2 s) one dead contact tried would cost.
JOIN_MARGIN = 1.5


def dead_addresses(count: int) -> list[str]:
    """Loopback addresses where nothing listens (checked by a refused connection)."""
    out = []
    port = 41000
    while len(out) < count:
        port += 1
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                out.append(f"127.0.0.1:{port}")
    return out


def test_dead_addresses_do_not_slow_a_newcomers_join(keyserver_factory, tmp_path):
    keyserver = keyserver_factory.start()
    cluster = Cluster(keyserver.base_url, keyserver.admin_token, tmp_path / "peers")
    try:
        cluster.wait_ready([cluster.start_root("root", ["symbol", "price", "volume"])])
        early = [cluster.start_subscriber(f"early{i}", "price < 500") for i in range(2)]
        cluster.wait_ready(early)
        unattacked = max(json.loads(p.ready_file.read_text())["join_seconds"] for p in early)

        token = cluster.admin.create_identity("mallory", "subscriber")["token"]
        raw = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
        refused, registered = 0, set()
        with KeyServerClient(keyserver.base_url, token) as mallory:
            for address in dead_addresses(DEAD):
                try:
                    mallory.enrol_transport(base64.b64encode(raw).decode(), [address])
                except KeyServerRequestError as exc:  # beyond the cap: refused, nothing evicted
                    assert (exc.status, exc.code) == (409, "too_many_addresses"), exc.body
                    refused += 1
                    continue
                mallory.register(address, "price", "subscriber", 600)
                registered.add(address)
            mallory.enrol_subscriber("price < 500")  # a subscriber looks up its own trees
            listed = mallory.lookup("price", sample=100)["members"]
        poison = [e for e in listed if e["address"] in registered]
        print(f"{len(poison)} dead addresses listed, {refused} refused")
        assert refused == DEAD - CAP
        # Control: the poison is there, and it is dead.
        assert len(poison) == CAP and not any(e["vouched"] for e in poison), listed
        for entry in poison:
            host, port = entry["address"].rsplit(":", 1)
            with socket.socket() as s:
                assert s.connect_ex((host, int(port))) != 0

        newcomer = cluster.start_subscriber("newcomer", "price < 500")
        cluster.wait_ready([newcomer], timeout=90)
        join = json.loads(newcomer.ready_file.read_text())["join_seconds"]
        print(f"newcomer joined in {join:.3f} s with {DEAD} dead addresses registered "
              f"(unattacked: {unattacked:.3f} s)")
        assert join < unattacked + JOIN_MARGIN, newcomer.log_tail()
    finally:
        cluster.stop_all()
