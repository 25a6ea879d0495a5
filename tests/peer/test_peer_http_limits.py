"""A peer's --http endpoint against hostile clients: idle and half-sent connections are
closed (a cap and a request deadline) without starving the overlay of file descriptors,
other Host names are refused (DNS rebinding), websocket and garbage requests neither
fail nor flood the log; and the small conveniences of `peer status` and the ready file."""

from __future__ import annotations

import logging
import os
import resource
import socket
import time

import httpx
import pytest

from ibe_pubsub.cli.peer import host_names
from ibe_pubsub.cli.status_view import fetch_status
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.peer.log_limits import RateLimit
from ibe_pubsub.peer.monitor import MAX_CONNECTIONS, REQUEST_TIMEOUT, host_allowed

FD_LIMIT = 256


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer closes ``sock`` within ``seconds`` (whatever it answers first)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def _exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


def _refused(metrics: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("ibe_peer_transport_refused_total{"))


@pytest.fixture(scope="module")
def root(keyserver, tmp_path_factory):
    """A root peer serving --http on every interface, with few file descriptors."""
    cluster = Cluster(keyserver.base_url, keyserver.admin_token,
                      tmp_path_factory.mktemp("peers"), verbose=True,
                      peer_args=("--http", "0.0.0.0:0"))
    try:
        peer = cluster.start_root("root", ["symbol"])
        cluster.wait_ready([peer])
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.prlimit(peer.process.pid, resource.RLIMIT_NOFILE, (FD_LIMIT, hard))
        yield peer
    finally:
        cluster.stop_all()


def test_idle_and_half_sent_connections_are_closed_and_the_overlay_still_accepts(root):
    url = root.http or ""
    assert url.startswith("http://127.0.0.1:")  # a wildcard bind, written connectable
    port = int(url.rsplit(":", 1)[1])
    refused_before = _refused(root.get("/metrics").text)
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    started = time.monotonic()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(FD_LIMIT + 44)]
    try:
        # Beyond the cap, connections are closed on arrival: the peer keeps its fds.
        assert _closed_within(idle[-1], 2.0)
        assert len(os.listdir(f"/proc/{root.process.pid}/fd")) < MAX_CONNECTIONS + 20
        overlay_port = (root.address or "").rsplit(":", 1)[1]
        assert _exchange(int(overlay_port), b"not a hello") == b""  # accepted, refused
        # The half-sent request is closed at its deadline, and so are the idle ones.
        assert _closed_within(half, REQUEST_TIMEOUT + 3)
        assert time.monotonic() - started < REQUEST_TIMEOUT + 3
        assert _closed_within(idle[0], 3)
        health = httpx.get(url + "/healthz", timeout=5)
        assert health.status_code == 200
        assert _refused(root.get("/metrics").text) == refused_before + 1
    finally:
        for sock in (half, *idle):
            sock.close()
    log = root.log_file.read_text()
    assert log.count("\n") < 40 and "Traceback" not in log


def test_other_host_names_websockets_and_garbage_are_refused_quietly(root):
    url = root.http or ""
    port = int(url.rsplit(":", 1)[1])
    rebound = httpx.get(url + "/status", headers={"Host": f"evil.example:{port}"})
    assert rebound.status_code == 421 and "evil.example" in rebound.json()["error"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "0.0.0.0"):
        assert httpx.get(url + "/status", headers={"Host": host}).status_code == 200
    websocket = (b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    seen = len(root.log_file.read_text())
    for _ in range(20):
        assert _exchange(port, websocket).startswith(b"HTTP/1.1 403 ")
        assert _exchange(port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    log = root.log_file.read_text()[seen:]
    assert "ERROR" not in log and log.count("\n") <= 4, log


def test_peer_status_takes_host_port_or_any_url_of_the_endpoint(root):
    address = (root.http or "").removeprefix("http://")
    for given in (address, f"http://{address}/metrics", f"http://{address}/status"):
        assert fetch_status(given)["address"] == root.address


def test_rate_limit_lets_one_record_through_per_interval_and_counts_the_rest():
    limit = RateLimit(interval=0.2)
    records = [logging.LogRecord("x", logging.WARNING, "", 0, "bad request from %s",
                                 (str(i),), None) for i in range(6)]
    assert [limit.filter(r) for r in records[:5]] == [True, False, False, False, False]
    time.sleep(0.25)
    assert limit.filter(records[5]) and "4 more" in records[5].getMessage()


def test_host_check_takes_ip_addresses_and_the_allowed_names_only():
    names = frozenset(host_names("Scraper.internal, localhost"))
    for header in (b"scraper.internal:9464", b"LOCALHOST", b"10.0.0.5:1", b"[::1]:9", None):
        assert host_allowed(header, names), header
    for header in (b"evil.example", b"scraper.internal.evil.example:9464", b""):
        assert not host_allowed(header, names), header
