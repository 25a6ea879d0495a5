"""Compact, versioned binary encoding of keys, ciphertexts and connection requests.

Every object starts with a type tag and the format version (2: scheme version 2;
version 1 is refused, naming it). Group elements use the backend's fixed-size
compressed encodings, lists a 16-bit count, strings and byte strings a length
prefix. Decoding checks every length and rejects trailing bytes: malformed input
fails with :class:`CodecError`. Keys are parsed through the group (curve and
subgroup checks) at once. The elements of events and connection requests are
checked when first used (:meth:`PairingGroup.unchecked`): a router uses one C1,
an opener one U, so neither pays for the rest. The byte layout is in
docs/wire-format.md.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G1, G2, GT, Element, GroupError, GroupKind, PairingGroup
from ibe_pubsub.credentials.keys import (
    SCHEME_VERSION,
    BlindedToken,
    MasterPublicKey,
    MasterSecretKey,
    PublisherKey,
    RoutingToken,
    SubscriberCredentialKey,
    SubscriberKey,
)
from ibe_pubsub.credentials.messages import (
    AttributeCiphertext,
    AttributeSignature,
    CertificatePart,
    ConnectionRequest,
    EncryptedEvent,
    EventHeader,
    RequestEntry,
    RouteEntry,
    SessionCertificate,
    StreamEvent,
)

FORMAT_VERSION = 2
#: Bytes of a routing tag R (SHA-256).
TAG_BYTES = 32
MAX_BLOB = 16 * 1024 * 1024
T = TypeVar("T")


class CodecError(CredentialsError, ValueError):
    """Bytes that do not decode to the expected object."""


class Writer:
    def __init__(self, tag: int) -> None:
        self.out = bytearray((tag, FORMAT_VERSION))

    def u8(self, v: int) -> Writer:
        self.out += struct.pack(">B", v)
        return self

    def u64(self, v: int) -> Writer:
        self.out += struct.pack(">Q", v)
        return self

    def blob(self, data: bytes) -> Writer:
        if len(data) > MAX_BLOB:
            raise CodecError("byte string too long to encode")
        self.out += struct.pack(">I", len(data)) + data
        return self

    def text(self, s: str) -> Writer:
        data = s.encode("utf-8")
        if len(data) > 0xFFFF:
            raise CodecError("string too long to encode")
        self.out += struct.pack(">H", len(data)) + data
        return self

    def fixed(self, data: bytes) -> Writer:
        self.out += data
        return self

    def element(self, e: Element) -> Writer:
        return self.fixed(bytes(e))

    def scalar(self, k: int, size: int) -> Writer:
        return self.fixed(k.to_bytes(size, "big"))

    def credential(self, c: Credential) -> Writer:
        return self.text(c.attribute).blob(c.encode())

    def many(self, items: Sequence[T], write: Callable[[Writer, T], object]) -> Writer:
        if len(items) > 0xFFFF:
            raise CodecError("list too long to encode")
        self.out += struct.pack(">H", len(items))
        for item in items:
            write(self, item)
        return self

    def fixed_many(self, items: Sequence[bytes]) -> Writer:
        """A list of byte strings of one fixed size: the count, then their concatenation."""
        if len(items) > 0xFFFF:
            raise CodecError("list too long to encode")
        self.out += struct.pack(">H", len(items)) + b"".join(items)
        return self

    def done(self) -> bytes:
        return bytes(self.out)


class Reader:
    """Reads what :class:`Writer` wrote; ``group`` None for objects with no group element
    (reading one is then a :class:`CodecError`)."""

    def __init__(self, group: PairingGroup | None, data: bytes, tag: int, what: str) -> None:
        self._group = group
        self.data = memoryview(data)
        self.pos = 0
        self.what = what
        if len(data) < 2 or data[0] != tag:
            raise CodecError(f"not an encoded {what}")
        if data[1] != FORMAT_VERSION:
            raise CodecError(f"{what}: format version {data[1]} is not supported; this build "
                             f"reads format version {FORMAT_VERSION} (scheme version 2) only")
        self.pos = 2

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise CodecError(f"{self.what}: truncated at byte {self.pos}")
        chunk = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def blob(self) -> bytes:
        (n,) = struct.unpack(">I", self.take(4))
        if n > MAX_BLOB:
            raise CodecError(f"{self.what}: byte string of {n} bytes is too long")
        return self.take(n)

    def text(self) -> str:
        (n,) = struct.unpack(">H", self.take(2))
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"{self.what}: string is not UTF-8") from exc

    @property
    def group(self) -> PairingGroup:
        if self._group is None:
            raise CodecError(f"{self.what}: holds no group element")
        return self._group

    def element(self, kind: GroupKind) -> Element:
        try:
            return self.group.deserialize(kind, self.take(self.group.sizes[kind]))
        except GroupError as exc:
            raise CodecError(f"{self.what}: {exc}") from exc

    def unchecked(self, kind: GroupKind) -> Element:
        """An element checked when first used (raises GroupError then)."""
        return self.group.unchecked(kind, self.take(self.group.sizes[kind]))

    def scalar(self) -> int:
        k = int.from_bytes(self.take(self.group.scalar_size), "big")
        if not 0 < k < self.group.order:
            raise CodecError(f"{self.what}: scalar out of range")
        return k

    def credential(self) -> Credential:
        attribute = self.text()
        try:
            return Credential.decode(attribute, self.blob())
        except ValueError as exc:
            raise CodecError(f"{self.what}: {exc}") from exc

    def many(self, read: Callable[[Reader], T]) -> tuple[T, ...]:
        (n,) = struct.unpack(">H", self.take(2))
        return tuple(read(self) for _ in range(n))

    def fixed_many(self, size: int) -> tuple[bytes, ...]:
        """A list written by :meth:`Writer.fixed_many` of items of ``size`` bytes."""
        (n,) = struct.unpack(">H", self.take(2))
        data = self.take(n * size)
        return tuple(data[k:k + size] for k in range(0, n * size, size))

    def end(self) -> None:
        if self.pos != len(self.data):
            raise CodecError(f"{self.what}: {len(self.data) - self.pos} trailing bytes")


# -- one encoder and one decoder per object -------------------------------------------------

TAG_MPK, TAG_MSK, TAG_PUB, TAG_SUBCRED, TAG_TOKEN, TAG_SUB, TAG_EVENT, TAG_HEADER = range(1, 9)
TAG_REQUEST, TAG_REQUEST_BODY, TAG_BLINDED = 9, 10, 11
#: Streams (v2.1, unchanged in v2.2); 12 is the signed digest's tag (credentials.scheme).
TAG_CERTIFICATE, TAG_CERTIFICATE_BODY, TAG_STREAM_EVENT, TAG_STREAM_HEADER = 13, 14, 15, 16
#: Bytes of an Ed25519 public key and signature, and of a SHA-256 hash.
VK_BYTES, SIGNATURE_BYTES, HASH_BYTES = 32, 64, 32
#: What a backup lists for a watcher (overlay repair).
TAG_ROUTE_ENTRY = 17
#: The public key of a threshold deployment and one server's key shares (scheme version 3,
#: credentials.threshold).
TAG_THRESHOLD_PUBLIC_KEY, TAG_SUBSCRIBER_KEY_SHARE, TAG_PUBLISHER_KEY_SHARE = 18, 19, 20
#: One server's partial threshold signature (scheme version 3).
TAG_PARTIAL_SIGNATURE = 21
TAG_BOUND_REQUEST_BODY = 22
#: One server's share of a routing token (a root's whole-domain token, scheme version 3).
TAG_TOKEN_SHARE = 23
#: A quorum's signatures: each member's own Ed25519 signature, by index (scheme version 3),
#: and the member keys the deployment vouches for.
TAG_QUORUM_SIGNATURE, TAG_MEMBER_KEYS = 24, 25


def encode_mpk(k: MasterPublicKey) -> bytes:
    return (Writer(TAG_MPK).text(k.curve).u8(k.version).element(k.g).element(k.g_hat)
            .element(k.g2).element(k.h).element(k.hd).element(k.Y).done())


def decode_mpk(group: PairingGroup, data: bytes) -> MasterPublicKey:
    r = Reader(group, data, TAG_MPK, "master public key")
    curve, version = r.text(), r.u8()
    if curve != group.curve:
        raise CodecError(f"master public key is for curve {curve}, this backend is {group.curve}")
    if version != SCHEME_VERSION:
        raise CodecError(f"master public key is for scheme version {version}, this build "
                         f"implements version {SCHEME_VERSION}")
    k = MasterPublicKey(curve=curve, version=version, g=r.element(G1), g_hat=r.element(G2),
                        g2=r.element(G1), h=r.element(G2), hd=r.element(G2), Y=r.element(GT))
    r.end()
    return k


def encode_msk(group: PairingGroup, k: MasterSecretKey) -> bytes:
    size = group.scalar_size
    return Writer(TAG_MSK).scalar(k.alpha, size).scalar(k.phi, size).scalar(k.beta, size).done()


def decode_msk(group: PairingGroup, data: bytes) -> MasterSecretKey:
    r = Reader(group, data, TAG_MSK, "master secret key")
    k = MasterSecretKey(alpha=r.scalar(), phi=r.scalar(), beta=r.scalar())
    r.end()
    return k


def _write_subcred(w: Writer, k: SubscriberCredentialKey) -> None:
    w.credential(k.credential).u64(k.epoch).element(k.S1).element(k.S2).element(k.T)


def _read_subcred(r: Reader) -> SubscriberCredentialKey:
    return SubscriberCredentialKey(credential=r.credential(), epoch=r.u64(), S1=r.element(G1),
                                   S2=r.element(G2), T=r.element(G1))


def _write_token(w: Writer, t: RoutingToken) -> None:
    w.credential(t.credential).u64(t.epoch).element(t.T)


def _read_token(r: Reader) -> RoutingToken:
    return RoutingToken(credential=r.credential(), epoch=r.u64(), T=r.element(G1))


def encode_publisher_key(k: PublisherKey) -> bytes:
    return Writer(TAG_PUB).credential(k.credential).u64(k.epoch).element(k.P1).element(
        k.P2).done()


def decode_publisher_key(group: PairingGroup, data: bytes) -> PublisherKey:
    r = Reader(group, data, TAG_PUB, "publisher key")
    k = PublisherKey(credential=r.credential(), epoch=r.u64(), P1=r.element(G1),
                     P2=r.element(G2))
    r.end()
    return k


def encode_routing_token(t: RoutingToken) -> bytes:
    w = Writer(TAG_TOKEN)
    _write_token(w, t)
    return w.done()


def decode_routing_token(group: PairingGroup, data: bytes) -> RoutingToken:
    r = Reader(group, data, TAG_TOKEN, "routing token")
    t = _read_token(r)
    r.end()
    return t


def encode_blinded_token(t: BlindedToken) -> bytes:
    return Writer(TAG_BLINDED).text(t.attribute).u8(t.position).u64(t.epoch).element(t.T).done()


def decode_blinded_token(group: PairingGroup, data: bytes) -> BlindedToken:
    r = Reader(group, data, TAG_BLINDED, "blinded routing token")
    t = BlindedToken(attribute=r.text(), position=r.u8(), epoch=r.u64(), T=r.element(G1))
    r.end()
    return t


def encode_subscriber_credential_key(k: SubscriberCredentialKey) -> bytes:
    w = Writer(TAG_SUBCRED)
    _write_subcred(w, k)
    return w.done()


def decode_subscriber_credential_key(group: PairingGroup, data: bytes) -> (
        SubscriberCredentialKey):
    r = Reader(group, data, TAG_SUBCRED, "subscriber credential key")
    k = _read_subcred(r)
    r.end()
    return k


def encode_subscriber_key(k: SubscriberKey) -> bytes:
    return (Writer(TAG_SUB).u64(k.epoch).element(k.D).many(k.credentials, _write_subcred)
            .many(k.fine_tokens, _write_token).done())


def decode_subscriber_key(group: PairingGroup, data: bytes) -> SubscriberKey:
    r = Reader(group, data, TAG_SUB, "subscriber key")
    k = SubscriberKey(epoch=r.u64(), D=r.element(G1), credentials=r.many(_read_subcred),
                      fine_tokens=r.many(_read_token))
    r.end()
    return k


def encode_header(h: EventHeader) -> bytes:
    """Canonical header bytes: the AEAD's associated data and part of the signed digest."""
    return (Writer(TAG_HEADER).text(h.schema_id).u64(h.epoch).text(h.event_id)
            .many(h.publisher_credentials, Writer.credential).done())


def _read_header(r: Reader) -> EventHeader:
    return EventHeader(schema_id=r.text(), epoch=r.u64(), event_id=r.text(),
                       publisher_credentials=r.many(Reader.credential))


def write_attribute(w: Writer, a: AttributeCiphertext) -> None:
    w.element(a.C1).fixed_many(a.E).fixed_many(a.R)


def _read_attribute(r: Reader) -> AttributeCiphertext:
    c1 = r.unchecked(G2)
    masked = r.fixed_many(r.group.sizes[G1])
    tags = r.fixed_many(TAG_BYTES)
    if len(masked) != len(tags) or not masked:
        raise CodecError(f"{r.what}: E and R lists differ in length")
    return AttributeCiphertext(C1=c1, E=masked, R=tags)


def encode_event(e: EncryptedEvent) -> bytes:
    return (Writer(TAG_EVENT).blob(encode_header(e.header)).element(e.C0)
            .many(e.attributes, write_attribute).blob(e.sealed)
            .many(e.signatures, lambda w, s: w.element(s.Sig).element(s.P2)).done())


def decode_event(group: PairingGroup, data: bytes) -> EncryptedEvent:
    r = Reader(group, data, TAG_EVENT, "encrypted event")
    header_bytes = r.blob()
    hr = Reader(group, header_bytes, TAG_HEADER, "event header")
    header = _read_header(hr)
    hr.end()
    event = EncryptedEvent(
        header=header, C0=r.unchecked(G2), attributes=r.many(_read_attribute), sealed=r.blob(),
        signatures=r.many(lambda rr: AttributeSignature(Sig=rr.unchecked(G1),
                                                        P2=rr.unchecked(G2))))
    r.end()
    n = len(event.attributes)
    if len(event.signatures) != n or len(header.publisher_credentials) != n:
        raise CodecError("encrypted event: attribute, signature and credential counts differ")
    return event


def encode_route_entry(e: RouteEntry) -> bytes:
    return Writer(TAG_ROUTE_ENTRY).u64(e.epoch).element(e.C1).fixed(e.R).done()


def decode_route_entry(group: PairingGroup, data: bytes) -> RouteEntry:
    r = Reader(group, data, TAG_ROUTE_ENTRY, "route entry")
    entry = RouteEntry(epoch=r.u64(), C1=r.unchecked(G2), R=r.take(TAG_BYTES))
    r.end()
    return entry


def _write_entry(w: Writer, e: RequestEntry) -> None:
    w.element(e.U).blob(e.sealed)


def _read_entry(r: Reader) -> RequestEntry:
    return RequestEntry(U=r.unchecked(G2), sealed=r.blob())


def encode_request_body(q: ConnectionRequest) -> bytes:
    """The bytes the key service signs: everything but the signature (tag 10; tag 22 with
    a threshold deployment's binding ``V`` at the end)."""
    tag = TAG_REQUEST_BODY if q.binding is None else TAG_BOUND_REQUEST_BODY
    w = (Writer(tag).text(q.attribute).u64(q.epoch).u64(q.expires_at).blob(q.nonce)
         .many(q.entries, _write_entry))
    return (w if q.binding is None else w.element(q.binding)).done()


def encode_request(q: ConnectionRequest) -> bytes:
    return Writer(TAG_REQUEST).blob(encode_request_body(q)).blob(q.signature).done()


def decode_request(group: PairingGroup, data: bytes) -> ConnectionRequest:
    r = Reader(group, data, TAG_REQUEST, "connection request")
    body, signature = r.blob(), r.blob()
    r.end()
    return replace(decode_request_body(group, body), signature=signature)


def decode_request_body(group: PairingGroup, body: bytes) -> ConnectionRequest:
    """A request's body (tag 10 or 22), without a signature yet."""
    bound = body[:1] == bytes([TAG_BOUND_REQUEST_BODY])
    b = Reader(group, body, TAG_BOUND_REQUEST_BODY if bound else TAG_REQUEST_BODY,
               "connection request")
    q = ConnectionRequest(attribute=b.text(), epoch=b.u64(), expires_at=b.u64(), nonce=b.blob(),
                          entries=b.many(_read_entry), signature=b"",
                          binding=b.unchecked(G2) if bound else None)
    b.end()
    if not q.entries:
        raise CodecError("connection request: no entries")
    return q


# -- streams (v2.1, v2.2) ----------------------------------------------------------------------

def encode_certificate_body(c: SessionCertificate) -> bytes:
    """vk || epoch || expiry || schema id || every p_i: hashed into m_c."""
    return (Writer(TAG_CERTIFICATE_BODY).fixed(c.vk).u64(c.epoch).u64(c.expires_at)
            .text(c.schema_id).many(c.publisher_credentials, Writer.credential).done())


def encode_certificate(c: SessionCertificate) -> bytes:
    return (Writer(TAG_CERTIFICATE).blob(encode_certificate_body(c))
            .many(c.parts, lambda w, p: w.element(p.Sig).element(p.P2).element(p.R)).done())


def decode_certificate(group: PairingGroup, data: bytes) -> SessionCertificate:
    r = Reader(group, data, TAG_CERTIFICATE, "session certificate")
    b = Reader(group, r.blob(), TAG_CERTIFICATE_BODY, "session certificate")
    vk, epoch, expires_at, schema_id = b.take(VK_BYTES), b.u64(), b.u64(), b.text()
    credentials = b.many(Reader.credential)
    b.end()
    parts = r.many(lambda rr: CertificatePart(Sig=rr.unchecked(G1), P2=rr.unchecked(G2),
                                              R=rr.unchecked(G2)))
    r.end()
    if len(parts) != len(credentials) or not parts:
        raise CodecError("session certificate: part and credential counts differ")
    return SessionCertificate(vk=vk, epoch=epoch, expires_at=expires_at, schema_id=schema_id,
                              publisher_credentials=credentials, parts=parts)


def encode_stream_header(header: EventHeader, vk: bytes, certificate_hash: bytes) -> bytes:
    """The version 2 header, the session key and the certificate's hash: the AEAD's
    associated data and the start of the signed digest."""
    return (Writer(TAG_STREAM_HEADER).blob(encode_header(header)).fixed(vk)
            .fixed(certificate_hash).done())


def encode_stream_event(e: StreamEvent) -> bytes:
    return (Writer(TAG_STREAM_EVENT).blob(encode_stream_header(e.header, e.vk,
                                                               e.certificate_hash))
            .blob(e.certificate).element(e.C0)
            .many(e.attributes, write_attribute).blob(e.sealed).fixed(e.signature).done())


def decode_stream_event(group: PairingGroup, data: bytes) -> StreamEvent:
    r = Reader(group, data, TAG_STREAM_EVENT, "stream event")
    hr = Reader(group, r.blob(), TAG_STREAM_HEADER, "stream event header")
    inner = Reader(group, hr.blob(), TAG_HEADER, "event header")
    header = _read_header(inner)
    inner.end()
    vk, certificate_hash = hr.take(VK_BYTES), hr.take(HASH_BYTES)
    hr.end()
    event = StreamEvent(header=header, vk=vk, certificate_hash=certificate_hash,
                        certificate=r.blob(), C0=r.unchecked(G2),
                        attributes=r.many(_read_attribute), sealed=r.blob(),
                        signature=r.take(SIGNATURE_BYTES))
    r.end()
    if len(event.attributes) != len(header.publisher_credentials):
        raise CodecError("stream event: attribute and credential counts differ")
    return event


def decode_any_event(group: PairingGroup, data: bytes) -> EncryptedEvent | StreamEvent:
    """A version 2 event or a stream event, told apart by the type tag."""
    if data[:1] == bytes((TAG_STREAM_EVENT,)):
        return decode_stream_event(group, data)
    return decode_event(group, data)
