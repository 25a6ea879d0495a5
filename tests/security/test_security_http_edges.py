"""Found by an attacker's review after the gate landed: what reaches the server before the
gate (the request line and headers) and a race between two first registrations.

* A client that never ends its headers, or sends a huge request line, must be cut off
  after a bounded number of bytes: the server's memory must not follow what it sends.
  The control sends the same bytes as a body to a public route, which the gate caps too,
  to show the probe really pushes that many bytes at the server.
* Concurrent first registrations of the same directory entry must all succeed (before:
  the loser of the insert got a 500).
"""

from __future__ import annotations

import base64
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from keyserver_fixtures import rss_mib

from ibe_pubsub.keyserver.client import KeyServerClient

PROBE_MIB = 64
LINK_KEY = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes_raw()).decode()
RSS_GROWTH_LIMIT_MIB = 20




def _push(port: int, head: bytes, filler: bytes, mib: int) -> tuple[int, bytes]:
    """Send ``head`` then ``mib`` MiB of ``filler``; how many MiB went out before the server
    closed, and what it answered."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        chunk = filler * ((1 << 20) // len(filler))
        try:
            for _ in range(mib):
                s.sendall(chunk)
                sent += 1
        except OSError:
            pass
        s.settimeout(5)
        try:
            answer = s.recv(200)
        except OSError:
            answer = b""
    return sent, answer


@pytest.mark.parametrize(("head", "filler"), [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-B: b\r\n"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ", b"a"),
    (b"GET /healthz?", b"a"),
], ids=["many-headers", "one-huge-header", "huge-request-line"])
def test_endless_headers_are_cut_off(keyserver_factory, head: bytes, filler: bytes) -> None:
    server = keyserver_factory.start(serve_args=("--workers", "1"))
    pid = keyserver_factory.processes[server.base_url].pid
    port = int(server.base_url.rsplit(":", 1)[1])
    before = rss_mib(pid)
    sent, answer = _push(port, head, filler, PROBE_MIB)
    growth = rss_mib(pid) - before
    print(f"{head[:20]!r}: {sent} of {PROBE_MIB} MiB sent before the server closed; "
          f"RSS +{growth:.1f} MiB; answer {answer[:40]!r}")
    assert sent < PROBE_MIB, "the server kept reading an endless request head"
    assert growth < RSS_GROWTH_LIMIT_MIB
    assert httpx.get(server.base_url + "/healthz", timeout=5).status_code == 200


def test_control_the_probe_pushes_its_bytes_when_the_server_reads_them(keyserver_factory):
    """The same 64 MiB as a chunked body to the bulk route with the admin token (whose
    limit is raised for this): all of it goes out, so a cut-off above is the server's."""
    server = keyserver_factory.start(serve_args=("--workers", "1", "--bulk-max-body",
                                                 str(2 * PROBE_MIB << 20)))
    port = int(server.base_url.rsplit(":", 1)[1])
    head = (f"POST /v1/admin/bulk HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{server.admin_token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {PROBE_MIB << 20}\r\n\r\n").encode()
    sent, _ = _push(port, head, b" ", PROBE_MIB)
    assert sent == PROBE_MIB


def test_concurrent_first_registrations_of_one_entry_all_succeed(keyserver) -> None:
    """Ten rounds, each a fresh address of a fresh identity (one identity holds at most
    8 addresses) registered by 8 concurrent requests."""
    admin = KeyServerClient(keyserver.base_url, keyserver.admin_token)
    statuses: list[int] = []
    for round_ in range(10):
        token = admin.create_identity(f"racer-{time.time_ns()}", "subscriber")["token"]
        with httpx.Client(base_url=keyserver.base_url,
                          headers={"Authorization": f"Bearer {token}"}, timeout=30) as http, \
                ThreadPoolExecutor(8) as pool:
            address = f"race{round_}-{time.time_ns()}.example:2"
            certified = http.post("/v1/enrol/transport",
                                  json={"public_key": LINK_KEY, "addresses": [address]})
            assert certified.status_code == 200, certified.text
            body = {"address": address, "attribute": "symbol", "role": "subscriber",
                    "ttl": 60}
            statuses += pool.map(lambda b: http.post("/v1/directory", json=b).status_code,
                                 [body] * 8)
    assert statuses == [201] * 80, statuses
