"""Ciphertexts and connection requests as immutable dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.groups import Element


@dataclass(frozen=True)
class EventHeader:
    """What travels in the clear: it names the publisher credentials p_i, not the values."""

    schema_id: str
    epoch: int
    event_id: str
    publisher_credentials: tuple[Credential, ...]


@dataclass(frozen=True)
class AttributeCiphertext:
    """Per attribute: C1 = ĝ^b; per position j, the tag R_j = H4(K_j) and the masked
    E_j = ser(F(Pu_SUB(A, c_j))^b) XOR KDF(K_j, ...), K_j = e(F(Pu_SUB(A, c_j)), h)^b.
    Both lists have the attribute's full number of positions (a string path is padded
    with random tags and masks); E are opaque bytes to everyone but a token holder."""

    C1: Element
    E: tuple[bytes, ...]
    R: tuple[bytes, ...]


@dataclass(frozen=True)
class RouteEntry:
    """(epoch, C1_i, R_ij) cut from an event: enough for a holder of a token at position j
    of attribute i to run the route test, nothing to decrypt or verify."""

    epoch: int
    C1: Element
    R: bytes


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
    """CR_c' = (U = ĝ^t, AEAD_{KDF(e(F(Pu_SUB(A, c')), h)^t, "cr")}(SW || position)): an
    anonymous (Boneh-Franklin) entry that only the token of c' opens; entries past the
    requester's own position are random."""

    U: Element
    sealed: bytes


@dataclass(frozen=True)
class ConnectionRequest:
    """A key-server-signed request to join the tree of ``attribute``; entry j is for position j."""

    attribute: str
    epoch: int
    expires_at: int
    nonce: bytes
    entries: tuple[RequestEntry, ...]
    signature: bytes
    binding: Element | None = None
    """A threshold deployment's requests (version 3): ``V = ĝ^s`` with ``s`` the requester's
    own secret. An opener's SW is then bound to ``e(T, V)``, so that the members, who can
    derive the SWs, cannot prove an opening (scheme.md 16.3)."""


@dataclass(frozen=True)
class RequestOpening:
    """What opening a request entry gives its opener: that entry's SW, and the position of
    the requester's credential (the overlay orders links by it)."""

    sw: bytes
    position: int


@dataclass(frozen=True)
class CertificatePart:
    """Cert_i = (P1_i * m_c^r_i, P2_i, ĝ^r_i): an identity-based signature of attribute i's
    publisher credential p_i over the session's certificate digest m_c."""

    Sig: Element
    P2: Element
    R: Element


@dataclass(frozen=True)
class SessionCertificate:
    """A stream's session certificate: binds the Ed25519 key ``vk`` to the publisher
    credentials p_i, for one epoch and schema, until ``expires_at`` (Unix seconds)."""

    vk: bytes
    epoch: int
    expires_at: int
    schema_id: str
    publisher_credentials: tuple[Credential, ...]
    parts: tuple[CertificatePart, ...]


@dataclass(frozen=True)
class StreamEvent:
    """An event of a stream: the version 2 header, the session key ``vk`` and the hash of
    the certificate (all signed), the encoded certificate itself for a peer that has not
    seen it (parsed only then), C0, the attribute entries (reused while their cell and
    window hold), the sealed payload, and an Ed25519 signature under the session key."""

    header: EventHeader
    vk: bytes
    certificate_hash: bytes
    certificate: bytes
    C0: Element
    attributes: tuple[AttributeCiphertext, ...]
    sealed: bytes
    signature: bytes
