"""Ciphertexts and connection requests as immutable dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from credentials.credential import Credential
from credentials.groups import Element


@dataclass(frozen=True)
class EventHeader:
    """What travels in the clear: it names the publisher credentials p_i, not the values."""

    schema_id: str
    epoch: int
    event_id: str
    publisher_credentials: tuple[Credential, ...]


@dataclass(frozen=True)
class AttributeCiphertext:
    """Per attribute: C1 = ĝ^b; per position j, C2_j = F(Pu_SUB(A, c_j))^b, R_j = H4(e(C2_j, h))."""

    C1: Element
    C2: tuple[Element, ...]
    R: tuple[bytes, ...]


@dataclass(frozen=True)
class AttributeSignature:
    """(Sig_i, P2_i); the third component C1_i is reused from the ciphertext."""

    Sig: Element
    P2: Element


@dataclass(frozen=True)
class EncryptedEvent:
    header: EventHeader
    C0: Element
    attributes: tuple[AttributeCiphertext, ...]
    sealed: bytes
    signatures: tuple[AttributeSignature, ...]


@dataclass(frozen=True)
class RequestEntry:
    """CR_c' = (ĝ^t, F(Pu_SUB(A, c'))^t, h^t, AEAD_{KDF(Y^t)}(SW)) for a covering credential c'."""

    g_hat_t: Element
    F_t: Element
    h_t: Element
    sealed_sw: bytes


@dataclass(frozen=True)
class ConnectionRequest:
    """A key-server-signed request to join the tree of ``attribute``; entry j is for position j."""

    attribute: str
    epoch: int
    expires_at: int
    nonce: bytes
    entries: tuple[RequestEntry, ...]
    signature: bytes

    @property
    def position(self) -> int:
        """Position of the requester's own credential (its last entry)."""
        return len(self.entries) - 1
