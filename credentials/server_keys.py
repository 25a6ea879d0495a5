"""Who vouches for connection requests and root certificates: one key server's Ed25519 key
(version 2), or ``t`` members of a threshold deployment with their shares of a BLS key
(version 3, :class:`credentials.threshold.ThresholdServer`). Peers check either through
:class:`ServerVerifier`, so nothing that checks a signature tells the two apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


class ServerVerifier(Protocol):
    """Checks the key service's signature of a message (each message carries its own domain
    tag, so a signature of one kind never passes for another)."""

    def verify(self, message: bytes, signature: bytes) -> bool: ...


@dataclass(frozen=True)
class Ed25519Server:
    """A single key server's raw 32-byte Ed25519 public key."""

    key: bytes

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True
