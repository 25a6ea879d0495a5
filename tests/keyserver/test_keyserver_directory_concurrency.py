"""Directory leases renewed at the same moment by peers that vouch for each other, on
PostgreSQL (a real server): each renewal updates the peer's own entry and its neighbours'
vouches, so two renewals that vouch for each other lock the same rows in opposite orders.
A 30-minute soak on PostgreSQL saw hundreds of them end in a deadlock, answered 500; every
renewal must now succeed."""

from __future__ import annotations

import base64
import threading

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.evaluation.postgres import fresh_database
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError

PEERS, ROUNDS = 8, 25


def _peer(server, name: str, port: int) -> tuple[KeyServerClient, str]:
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    token = admin.create_identity(name, "subscriber")["token"]
    client = KeyServerClient(server.base_url, token, retries=0)
    client.enrol_subscriber("price < 100")
    key = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    address = f"127.0.0.1:{port}"
    client.enrol_transport(base64.b64encode(key).decode(), [address])
    return client, address


def test_mutually_vouching_renewals_at_once_all_succeed(postgres_url, keyserver_factory):
    url = fresh_database(postgres_url)
    server = keyserver_factory.start(init_args=("--database-url", url),
                                     serve_args=("--database-url", url))
    peers = [_peer(server, f"vouching-{i}", 20000 + i) for i in range(PEERS)]
    addresses = [a for _, a in peers]
    for client, address in peers:  # every entry exists before the race
        client.register(address, "price", "subscriber", 60)
    start = threading.Barrier(PEERS)
    failures: list[str] = []

    def renew(client: KeyServerClient, address: str) -> None:
        start.wait()
        for _ in range(ROUNDS):
            try:
                client.register(address, "price", "subscriber", 60,
                                seen=[a for a in addresses if a != address])
            except KeyServerRequestError as exc:
                failures.append(f"{exc.status}: {exc}")

    threads = [threading.Thread(target=renew, args=peer) for peer in peers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [], f"{len(failures)} of {PEERS * ROUNDS} failed, e.g. {failures[:3]}"
    # Every entry was vouched for by the others.
    members = KeyServerClient(server.base_url, server.admin_token).lookup("price", 50)
    assert {m["address"] for m in members["members"] if m["vouched"]} == set(addresses)
