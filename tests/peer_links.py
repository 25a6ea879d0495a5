"""Helpers for the peer-transport tests: an inbox to wait on, and listening peers holding
certificates for the address they listen on (issued after listening, as a node does)."""

from __future__ import annotations

import asyncio
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tls_certificates import PeerCA

from ibe_pubsub.peer.transport import Backoff, Transport

FAST = Backoff(initial=0.05, cap=0.2, attempts=4)


class Inbox:
    """Collects (sender, payload) and lets a test wait for a count."""

    def __init__(self) -> None:
        self.items: list[tuple[str, bytes]] = []
        self.changed = asyncio.Event()

    def __call__(self, sender: str, payload: bytes) -> None:
        self.items.append((sender, payload))
        self.changed.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[tuple[str, bytes]]:
        async def loop() -> None:
            while len(self.items) < count:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)
        return self.items


async def secure_peer(ca: PeerCA, inbox: Inbox, *, key: Ed25519PrivateKey | None = None,
                      lifetime: float = 3600.0, port: int = 0, **transport: Any) -> Transport:
    """A transport listening on 127.0.0.1 with ``ca``'s certificate for its address."""
    peer = Transport(inbox, backoff=FAST, **transport)
    await peer.listen("127.0.0.1", port)
    peer.tls = ca.credentials((peer.address,), key=key, lifetime=lifetime)
    return peer
