"""The cost of opening a peer link: mutual TLS 1.3 against plaintext, on loopback.

Each connection is a fresh non-listening peer (as a publisher is) dialing one listening
peer: TCP connect, the TLS handshake with both certificates checked, HELLO both ways and
the first frame delivered to the listener's handler. Certificates come from a throwaway
CA made here, like the key server's peer-link CA. The difference between the two means is
what authentication adds to each new link; an established link pays only the record
encryption.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials import PeerBinding, ca_certificate, issue_peer_certificate, to_pem
from ibe_pubsub.evaluation.exceptions import BenchSettingsError
from ibe_pubsub.peer import PeerTLS, Transport


def run_transport_bench(connections: int = 200) -> dict[str, float]:
    """Mean milliseconds per connection with TLS and in plaintext, and their difference."""
    if connections < 1:
        raise BenchSettingsError("connections must be at least 1")
    tls_ms = asyncio.run(_per_connection(connections, secure=True)) * 1000
    plain_ms = asyncio.run(_per_connection(connections, secure=False)) * 1000
    return {"connections": connections, "tls_ms": round(tls_ms, 3),
            "plaintext_ms": round(plain_ms, 3), "tls_overhead_ms": round(tls_ms - plain_ms, 3)}


class _ThrowawayCA:
    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        self._pem = to_pem(ca_certificate(self._key))

    def credentials(self, addresses: Sequence[str]) -> PeerTLS:
        key, now = Ed25519PrivateKey.generate(), time.time()
        binding = PeerBinding("bench", "subscriber" if addresses else "publisher",
                              tuple(addresses), (), 0)
        cert = issue_peer_certificate(self._key, key.public_key(), binding, now, now + 3600)
        return PeerTLS(key, to_pem(cert), self._pem)


async def _per_connection(connections: int, *, secure: bool) -> float:
    """Mean seconds from a new peer's first send to the frame's delivery."""
    ca = _ThrowawayCA() if secure else None
    arrived = asyncio.Event()
    listener = Transport(lambda sender, payload: arrived.set(), secure=secure)
    await listener.listen("127.0.0.1", 0)
    if ca is not None:
        listener.tls = ca.credentials((listener.address,))
    client_tls = ca.credentials(()) if ca is not None else None
    total = 0.0
    try:
        for _ in range(connections):
            client = Transport(lambda sender, payload: None, tls=client_tls, secure=secure)
            arrived.clear()
            started = time.perf_counter()
            client.send(listener.address, b"first frame")
            await asyncio.wait_for(arrived.wait(), 10)
            total += time.perf_counter() - started
            await client.close(0)
    finally:
        await listener.close(0)
    return total / connections
