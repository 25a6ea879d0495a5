"""Eclipse attempts on running peers, from outside, with real peer processes and a real key
server. The attacker holds only public bytes, its own identity's token, or a certificate from
another key server; it opens one TCP connection to a subscriber and claims to be the
subscriber's parent (the root). With the default mutual TLS every attempt is refused and
counted, and every event published during the attack arrives. The control runs the same
attack on plaintext links (``--insecure-transport``): there the one connection takes the
root's place and events are lost, so the test would notice if the refusal went away.

A second test fills the directory with dead addresses and times a newcomer's join.
"""

from __future__ import annotations

import base64
import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess
from ibe_pubsub.keyserver.bundles import decode_params, decode_transport_certificate
from ibe_pubsub.keyserver.client import KeyServerClient
from ibe_pubsub.peer import frames
from ibe_pubsub.peer.tls import PeerTLS

pytestmark = [pytest.mark.timeout(240), pytest.mark.serial]

#: Short failure detection, so a parent cut off by the attack is given up within seconds.
PEER_ARGS = ("--heartbeat", "0.5", "--failure-timeout", "3")
ATTACK_SECONDS = 6.0
QUOTES = [Event(f"q{i}", {"symbol": "IBM", "price": 100.0 + i, "volume": 1000 + i})
          for i in range(4)]


def free_port_between(low: int, high: int) -> int:
    """A free 127.0.0.1 port in [low, high): the root's port is chosen to sort before the
    subscriber's, which makes the root's address the one whose connection the subscriber
    keeps when two claim it (the transport's rule), as an attacker would arrange."""
    for port in random.Random().sample(range(low, high), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in [{low}, {high})")


class HostileConnection:
    """One connection to a peer that says HELLO as ``claimed`` and then only listens,
    counting the frames the peer sends it (pings and joins meant for the real root)."""

    def __init__(self, target: str, claimed: str, tls: ssl.SSLContext | None = None) -> None:
        host, port = target.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=5)
        self.handshake_error: str | None = None
        self.sock: socket.socket = raw
        if tls is not None:
            try:
                self.sock = tls.wrap_socket(raw)
            except (ssl.SSLError, OSError) as exc:
                self.handshake_error = str(exc)
        self.hello: str | None = None
        self.data_frames = 0
        self._closed = threading.Event()
        if self.handshake_error is None:
            try:
                self.sock.sendall(frames.encode(frames.hello(claimed)))
            except OSError as exc:
                self.handshake_error = str(exc)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        self.sock.settimeout(0.5)
        buffer = b""
        while not self._closed.is_set():
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                return
            if not chunk:
                return
            buffer += chunk
            while len(buffer) >= frames.HEADER:
                length = int.from_bytes(buffer[:frames.HEADER], "big")
                if len(buffer) < frames.HEADER + length:
                    break
                frame = frames.decode_body(buffer[frames.HEADER:frames.HEADER + length])
                buffer = buffer[frames.HEADER + length:]
                if frame.kind == frames.HELLO:
                    self.hello = str(frame.payload)
                else:
                    self.data_frames += 1

    def close(self) -> None:
        self._closed.set()
        self.sock.close()
        self._reader.join(2)


def attacker_tls(base_url: str, admin: KeyServerClient, name: str, address: str
                 ) -> ssl.SSLContext:
    """A client TLS context holding a genuine certificate of a fresh subscriber identity
    ``name`` of the key server at ``base_url``, for its own address."""
    token = admin.create_identity(name, "subscriber")["token"]
    with KeyServerClient(base_url, token) as client:
        params = decode_params(load_group(), client.params())
        key = Ed25519PrivateKey.generate()
        raw = key.public_key().public_bytes_raw()
        doc = client.enrol_transport(base64.b64encode(raw).decode(), [address])
    certificate = decode_transport_certificate(doc, params, raw)
    return PeerTLS(key, certificate.pem, params.peer_ca).client_context


@contextmanager
def overlay(server, workdir: Path, insecure: bool) -> Iterator[tuple[Cluster, PeerProcess,
                                                                      PeerProcess]]:
    """A root of every tree and one subscriber ('victim'), the root on the lower port."""
    cluster = Cluster(server.base_url, server.admin_token, workdir, peer_args=PEER_ARGS,
                      insecure_transport=insecure)
    try:
        root = cluster.start_root("root", ["symbol", "price", "volume"],
                                  listen=f"127.0.0.1:{free_port_between(20000, 29999)}")
        cluster.wait_ready([root])
        victim = cluster.start_subscriber("victim", "price < 500",
                                          listen=f"127.0.0.1:{free_port_between(62000, 64999)}")
        cluster.wait_ready([victim])
        yield cluster, root, victim
    finally:
        cluster.stop_all()


def publish_during_attack(cluster: Cluster, attack: list[HostileConnection],
                          wait: float = 10.0) -> set[str]:
    """Let the attack run past failure detection, publish, and return the ids delivered
    within ``wait`` seconds."""
    time.sleep(ATTACK_SECONDS)
    result = cluster.publish("publisher", QUOTES, interval=0.1)
    assert result.returncode == 0, result.stderr
    cluster.wait_deliveries({"victim": {e.event_id for e in QUOTES}}, timeout=wait, idle=4)
    for connection in attack:
        connection.close()
    return {d["id"] for d in cluster.peers["victim"].delivered()}


def test_one_connection_cannot_eclipse_a_subscriber(keyserver_factory, tmp_path):
    keyserver, foreign = keyserver_factory.start(), keyserver_factory.start()
    with overlay(keyserver, tmp_path / "peers", insecure=False) as (cluster, root, victim):
        assert root.address and victim.address
        # 1. No certificate at all: plain TCP, HELLO claiming the root's address.
        plain = HostileConnection(victim.address, claimed=root.address)
        # 2. A genuine certificate of another identity, for its own address, claiming the
        #    root's address (the mutual-TLS variant of the eclipse).
        own = f"127.0.0.1:{free_port_between(30000, 31999)}"
        genuine = attacker_tls(keyserver.base_url, cluster.admin, "mallory", own)
        spoof = HostileConnection(victim.address, claimed=root.address, tls=genuine)
        # Control: the same certificate claiming the address it names is accepted.
        honest = HostileConnection(victim.address, claimed=own, tls=genuine)
        # 3. A certificate from another key server's CA.
        with KeyServerClient(foreign.base_url, foreign.admin_token) as foreign_admin:
            alien = attacker_tls(foreign.base_url, foreign_admin, "alien", own)
        alien.verify_mode = ssl.CERT_NONE  # the attacker need not trust the victim's CA
        stranger = HostileConnection(victim.address, claimed=root.address, tls=alien)

        delivered = publish_during_attack(cluster, [plain, spoof, honest, stranger])
        time.sleep(0.5)
        assert honest.hello == victim.address, "control: a certified address is accepted"
        for hostile in (plain, spoof, stranger):
            assert hostile.hello is None and hostile.data_frames == 0
    refused = victim.stats()["transport"]["refused"]
    print(f"mutual TLS: {len(delivered)} of {len(QUOTES)} events delivered during the attack, "
          f"refused {refused}")
    assert delivered == {e.event_id for e in QUOTES}, victim.log_tail()
    assert refused.get("address_mismatch", 0) >= 1, refused
    assert refused.get("foreign_ca", 0) >= 1, refused
    assert refused.get("tls", 0) + refused.get("bad_hello", 0) >= 1, refused
    assert victim.stats()["parents_lost"] == 0


def test_control_plaintext_links_are_eclipsed_by_one_connection(keyserver_factory, tmp_path):
    """What the refusals above prevent: on plaintext links the subscriber takes the claim,
    talks to the attacker instead of its root, and misses what is published meanwhile."""
    keyserver = keyserver_factory.start()
    with overlay(keyserver, tmp_path / "peers", insecure=True) as (cluster, root, victim):
        assert root.address and victim.address
        hostile = HostileConnection(victim.address, claimed=root.address)
        # This victim misses events, so waiting for all of them would always run out the
        # clock; a short wait (still at least ``idle``) sees what gets through.
        delivered = publish_during_attack(cluster, [hostile], wait=3.0)
        assert hostile.hello == victim.address and hostile.data_frames > 0
    print(f"plaintext: {len(delivered)} of {len(QUOTES)} events delivered during the attack, "
          f"{hostile.data_frames} frames meant for the root went to the attacker")
    assert delivered != {e.event_id for e in QUOTES}
