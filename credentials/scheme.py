"""The algorithms of the scheme (docs/scheme.md, version 2), one function each, named after
the algorithm.

Notation follows docs/scheme.md: multiplicative groups, ``**`` for exponentiation by a
public exponent and :meth:`PairingGroup.exp_secret` for a secret one (constant time),
``F`` hashes identity strings onto G1, ``M`` hashes the signed digest onto G1.
:class:`PublicParams` carries what every peer has (group, MPK, schema) plus the
per-epoch caches of ``F(c)`` and ``e(F(c), h)`` that make encryption cheap.

Version 2 makes every ciphertext component that names a credential anonymous: an
event carries per position only a tag ``R_ij = H4(K_ij)`` and the masked
``E_ij = ser(F_ij^b_i) XOR KDF(K_ij, ...)`` under the position key
``K_ij = e(F_ij, h)^b_i``, which only the routing token ``T = F^phi`` recomputes, as
``e(T, C1_i)``; a connection-request entry is a Boneh-Franklin ciphertext that only the
token of its credential opens.

A round trip through the algorithms (this runs as a doctest in the test suite). The
trusted party sets up the scheme and issues keys; a publisher holding keys for every
credential encrypts and signs an event; only a subscriber whose credentials match it
decrypts it::

    >>> from ibe_pubsub.credentials.backends import load_group
    >>> from ibe_pubsub.credentials.decomposition import decompose
    >>> from ibe_pubsub.credentials.predicates import parse_predicate
    >>> from ibe_pubsub.credentials.schema import default_schema
    >>> group, schema, epoch = load_group(), default_schema(), 1
    >>> def credentials(subscription):
    ...     parts = decompose(schema, parse_predicate(schema, subscription))
    ...     return [c for cs in parts.values() for c in cs]
    >>> mpk, msk = setup(group)
    >>> pp = PublicParams(group, mpk, schema)
    >>> publisher = [keygen_publisher(pp, msk, c, epoch) for c in credentials("")]
    >>> event = Event("quote-1", {"symbol": "IBM", "price": 131.5, "volume": 2000}, b"hello")
    >>> ciphertext = encrypt_and_sign(pp, publisher, event)
    >>> verify(pp, ciphertext)
    True
    >>> reader = keygen_subscriber(pp, msk, epoch, credentials('symbol = "IBM"'))
    >>> decrypt(pp, prepare_subscriber_key(pp, reader), ciphertext) == event
    True
    >>> other = keygen_subscriber(pp, msk, epoch, credentials("price > 500"))
    >>> decrypt(pp, prepare_subscriber_key(pp, other), ciphertext)
    Traceback (most recent call last):
    ...
    ibe_pubsub.credentials.scheme.DecryptionError: no credential on 'price' matches the event
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ibe_pubsub.credentials.codec import (
    TAG_BYTES,
    CodecError,
    Writer,
    encode_header,
    encode_request,
    encode_request_body,
    write_attribute,
)
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import enclosing_path, value_credential
from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.groups import G1, G2, Element, GroupError, PairingGroup, PreparedG2
from ibe_pubsub.credentials.keys import (
    BlindedToken,
    MasterPublicKey,
    MasterSecretKey,
    PublisherKey,
    RoutingToken,
    SubscriberCredentialKey,
    SubscriberKey,
)
from ibe_pubsub.credentials.lru import LRU
from ibe_pubsub.credentials.messages import (
    AttributeCiphertext,
    AttributeSignature,
    ConnectionRequest,
    EncryptedEvent,
    EventHeader,
    RequestEntry,
    RequestOpening,
    RouteEntry,
    StreamEvent,
)
from ibe_pubsub.credentials.schema import Attribute, Schema, SchemaError
from ibe_pubsub.credentials.server_keys import ServerVerifier
from ibe_pubsub.credentials.symmetric import (
    H4,
    KDF,
    NONCE_BYTES,
    AuthenticationFailed,
    mac,
    mac_equal,
    open_sealed,
    prf_bytes,
    prf_scalar,
    seal,
)

PUB, SUB = "PUB", "SUB"
#: Domain separation tags of F and M (RFC 9380 DSTs).
DST_ID = b"IBE-PUBSUB-V2-ID"
DST_MSG = b"IBE-PUBSUB-V2-MSG"
BATCH_WEIGHT_BITS = 64
SW_BYTES = 32
MAX_PAYLOAD = 8 * 1024 * 1024
#: The sealed payload is padded to a multiple of this many bytes.
PAYLOAD_BUCKET = 256
#: Tag of the signed digest's input (see docs/wire-format.md).
TAG_DIGEST = 12
#: Both kinds of event: version 2, or of a stream (section 15).
AnyEvent = EncryptedEvent | StreamEvent
#: e(T, C1_i) by (T, C1_i): the position keys a peer remembers for a stream's reused C1_i.
PositionKeys = LRU[tuple[bytes, bytes], Element]


class SchemeError(CredentialsError, ValueError):
    """Base of every refusal by the scheme."""


class NotAuthorized(SchemeError):
    """The publisher holds no credential covering a value of the event."""


class DecryptionError(SchemeError):
    """The event cannot be decrypted with these keys, or its content contradicts its header."""


class RequestRejected(SchemeError):
    """A connection request failed its signature, epoch, expiry or shape checks."""


@dataclass(frozen=True)
class Event:
    """A plaintext event: a value for every attribute of the schema, and an opaque body."""

    event_id: str
    values: dict[str, Any]
    body: bytes = b""


def _length_prefixed(*parts: bytes) -> bytes:
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def identity_string(attribute: str, role: str, epoch: int, credential: Credential) -> bytes:
    """Pu = enc(attribute, role, epoch, credential), report eq. 6.1 / 6.3."""
    if role not in (PUB, SUB):
        raise SchemeError(f"role must be PUB or SUB, not {role!r}")
    return _length_prefixed(attribute.encode(), role.encode(), epoch.to_bytes(8, "big"),
                            credential.encode())


class PublicParams:
    """Group, master public key and schema, with the precomputations every peer reuses."""

    def __init__(self, group: PairingGroup, mpk: MasterPublicKey, schema: Schema,
                 cache_size: int = 32768) -> None:
        self.group = group
        self.mpk = mpk
        self.schema = schema
        self.g_hat = group.prepare(mpk.g_hat)
        self.h = group.prepare(mpk.h)
        self._f: LRU[bytes, Element] = LRU(cache_size)
        self._f_h: LRU[bytes, Element] = LRU(cache_size)

    def F(self, identity: bytes) -> Element:
        """F(s): RFC 9380 hash onto G1 with domain tag DST_ID (cached)."""
        cached = self._f.get(identity)
        if cached is not None:
            return cached
        return self._f.remember(identity, self.group.hash_to_g1(identity, DST_ID))

    def F_h(self, identity: bytes) -> Element:
        """e(F(s), h) (cached): turns the per-position pairing of encryption into a GT power."""
        cached = self._f_h.get(identity)
        if cached is not None:
            return cached
        return self._f_h.remember(identity, self.group.pair(self.F(identity), self.h))

    def M(self, digest: bytes) -> Element:
        """M(d): RFC 9380 hash onto G1 with domain tag DST_MSG."""
        return self.group.hash_to_g1(digest, DST_MSG)


# -- Setup (Algorithm 1) --------------------------------------------------------------------

def setup(group: PairingGroup) -> tuple[MasterPublicKey, MasterSecretKey]:
    """alpha, phi, beta, y in Zq*; g2 = g^y; h = ĝ^phi; hd = ĝ^beta; Y = e(g2, ĝ)^alpha."""
    alpha, phi, beta, y = (group.random_scalar() for _ in range(4))
    g, g_hat = group.generator(G1), group.generator(G2)
    g2 = group.exp_secret(g, y)
    mpk = MasterPublicKey(curve=group.curve, g=g, g_hat=g_hat, g2=g2,
                          h=group.exp_secret(g_hat, phi), hd=group.exp_secret(g_hat, beta),
                          Y=group.pair(group.exp_secret(g2, alpha), g_hat))
    return mpk, MasterSecretKey(alpha=alpha, phi=phi, beta=beta)


# -- Key generation (eq. 6.2, 6.4) ------------------------------------------------------------

def keygen_publisher(pp: PublicParams, msk: MasterSecretKey, credential: Credential,
                     epoch: int) -> PublisherKey:
    """P1 = g2^alpha * F(Pu_PUB(A, c))^gamma, P2 = ĝ^gamma."""
    group, mpk = pp.group, pp.mpk
    gamma = group.random_scalar()
    F = pp.F(identity_string(credential.attribute, PUB, epoch, credential))
    return PublisherKey(credential=credential, epoch=epoch,
                        P1=group.exp_secret(mpk.g2, msk.alpha) * group.exp_secret(F, gamma),
                        P2=group.exp_secret(mpk.g_hat, gamma))


def keygen_routing_token(pp: PublicParams, msk: MasterSecretKey, credential: Credential,
                         epoch: int) -> RoutingToken:
    """T = F(Pu_SUB(A, c))^phi (Pr^s[3])."""
    F = pp.F(identity_string(credential.attribute, SUB, epoch, credential))
    return RoutingToken(credential=credential, epoch=epoch, T=pp.group.exp_secret(F, msk.phi))


def keygen_subscriber(pp: PublicParams, msk: MasterSecretKey, epoch: int,
                      credentials: Sequence[Credential],
                      fine_credentials: Sequence[Credential] = ()) -> SubscriberKey:
    """One gamma_s binds them all: D = g2^((gamma_s + alpha) / beta); per credential, fresh
    gamma: S1 = g2^gamma_s * F^gamma, S2 = ĝ^gamma, T = F^phi; and T for each fine
    credential."""
    group, mpk = pp.group, pp.mpk
    gamma_s = group.random_scalar()
    D = group.exp_secret(mpk.g2, (gamma_s + msk.alpha) * pow(msk.beta, -1, group.order))
    g2_gamma_s = group.exp_secret(mpk.g2, gamma_s)
    keys = []
    for c in credentials:
        gamma = group.random_scalar()
        F = pp.F(identity_string(c.attribute, SUB, epoch, c))
        keys.append(SubscriberCredentialKey(
            credential=c, epoch=epoch, S1=g2_gamma_s * group.exp_secret(F, gamma),
            S2=group.exp_secret(mpk.g_hat, gamma), T=group.exp_secret(F, msk.phi)))
    fine = tuple(keygen_routing_token(pp, msk, c, epoch) for c in fine_credentials)
    return SubscriberKey(epoch=epoch, D=D, credentials=tuple(keys), fine_tokens=fine)


def prepare_subscriber_key(pp: PublicParams, key: SubscriberKey) -> SubscriberKey:
    """Precompute the Miller loops of every S2, which each decryption pairs once."""
    return replace(key, credentials=tuple(
        replace(k, S2_prepared=pp.group.prepare(k.S2)) for k in key.credentials))


# -- Encrypt and sign (report 6.3) ------------------------------------------------------------

def publisher_key_for(keys: Sequence[PublisherKey], leaf: Credential) -> PublisherKey:
    """The publisher's key whose credential covers a value's finest credential ``leaf``."""
    for key in keys:
        if key.credential.covers(leaf):
            return key
    raise NotAuthorized(f"no publisher credential covers the value of {leaf.attribute!r}")


def payload(event: Event) -> bytes:
    """msgpack({"v": values, "b": body}), then 0x80 and zeros up to a multiple of
    PAYLOAD_BUCKET bytes, so the ciphertext's size does not give away a value's length."""
    packed = msgpack.packb({"v": event.values, "b": event.body}, use_bin_type=True) + b"\x80"
    return packed + bytes(-len(packed) % PAYLOAD_BUCKET)


def _unpad(padded: bytes) -> bytes:
    stripped = padded.rstrip(b"\x00")
    if not stripped.endswith(b"\x80"):
        raise DecryptionError("malformed payload: bad padding")
    return stripped[:-1]


def _mask_info(event_id: str, i: int, j: int) -> bytes:
    """KDF info of the mask of E_ij: "c2" || event id || i || j."""
    return b"c2" + _length_prefixed(event_id.encode()) + i.to_bytes(2, "big") + j.to_bytes(
        2, "big")


def _xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise SchemeError("xor of byte strings of different lengths")
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big")


def signed_digest(header_bytes: bytes, C0: Element, attributes: Sequence[AttributeCiphertext],
                   signatures: Sequence[AttributeSignature], sealed: bytes) -> bytes:
    """SHA-256(header || C0 || every C1_i, E_i, R_i || every P2_i || sealed payload)."""
    w = Writer(TAG_DIGEST).blob(header_bytes).element(C0)
    for a in attributes:
        write_attribute(w, a)
    for s in signatures:
        w.element(s.P2)
    return hashlib.sha256(w.blob(sealed).done()).digest()


def encrypt_attribute(pp: PublicParams, attribute: Attribute, i: int, epoch: int,
                      event_id: str, path: Sequence[Credential], b: int) -> AttributeCiphertext:
    """C1_i = ĝ^b_i; per position j of the value's path, K_ij = e(F_ij, h)^b_i,
    R_ij = H4(K_ij), E_ij = ser(F_ij^b_i) XOR KDF(K_ij, "c2" || id || i || j); then random
    tags and masks up to the attribute's number of positions."""
    return run_steps(encrypt_attribute_steps(pp, attribute, i, epoch, event_id, path, b))


def encrypt_attribute_steps(pp: PublicParams, attribute: Attribute, i: int, epoch: int,
                            event_id: str, path: Sequence[Credential], b: int
                            ) -> Generator[None, None, AttributeCiphertext]:
    """:func:`encrypt_attribute`, pausing after each position (two exponentiations, about
    half a millisecond): a stream prepares its next header this way between events."""
    group = pp.group
    size = group.sizes[G1]
    tags, masked = [], []
    for j, c in enumerate(path):
        identity = identity_string(attribute.name, SUB, epoch, c)
        K = pp.F_h(identity) ** b
        tags.append(H4(K))
        masked.append(_xor(bytes(group.exp_secret(pp.F(identity), b)),
                           KDF(K, _mask_info(event_id, i, j), size)))
        yield
    for _ in range(len(path), attribute.positions):
        tags.append(group.random_bytes(TAG_BYTES))
        masked.append(group.random_bytes(size))
    return AttributeCiphertext(C1=group.exp_secret(pp.mpk.g_hat, b), E=tuple(masked),
                               R=tuple(tags))


Entries = tuple[list[int], tuple[AttributeCiphertext, ...], Element, Element]


def encrypt_entries(pp: PublicParams, epoch: int, mask_id: str,
                    paths: Sequence[Sequence[Credential]]) -> Entries:
    """Per attribute i a fresh b_i and :func:`encrypt_attribute` (masks bound to
    ``mask_id``); s = sum b_i, C0 = hd^s and Y^s: every part of an event that depends on
    the b_i but not on its payload."""
    return run_steps(encrypt_entries_steps(pp, epoch, mask_id, paths))


def encrypt_entries_steps(pp: PublicParams, epoch: int, mask_id: str,
                          paths: Sequence[Sequence[Credential]]
                          ) -> Generator[None, None, Entries]:
    """:func:`encrypt_entries`, pausing after each position (see
    :func:`encrypt_attribute_steps`)."""
    group = pp.group
    b = [group.random_scalar() for _ in pp.schema.attributes]
    attributes = []
    for i, (a, path, b_i) in enumerate(zip(pp.schema.attributes, paths, b, strict=True)):
        attributes.append((yield from encrypt_attribute_steps(pp, a, i, epoch, mask_id, path,
                                                              b_i)))
    s = sum(b) % group.order
    return b, tuple(attributes), group.exp_secret(pp.mpk.hd, s), pp.mpk.Y ** s


T = TypeVar("T")


def run_steps(steps: Generator[None, None, T]) -> T:
    """Run a stepwise computation to its end; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def plan_publication(pp: PublicParams, keys: Sequence[PublisherKey], event: Event
                     ) -> tuple[int, list[tuple[Credential, ...]], list[PublisherKey]]:
    """The epoch of ``keys``, each value's credential path, and per attribute the publisher
    key that covers the value; NotAuthorized if the values or the keys do not allow it."""
    if not keys:
        raise NotAuthorized("no publisher keys")
    epoch = keys[0].epoch
    if any(k.epoch != epoch for k in keys):
        raise NotAuthorized("publisher keys of different epochs")
    try:
        values = pp.schema.validate_values(event.values)
    except SchemaError as exc:
        raise NotAuthorized(str(exc)) from exc
    paths = [enclosing_path(pp.schema, a.name, values[a.name]) for a in pp.schema.attributes]
    return epoch, paths, [publisher_key_for(keys, path[-1]) for path in paths]


def encrypt_and_sign(pp: PublicParams, keys: Sequence[PublisherKey], event: Event
                     ) -> EncryptedEvent:
    """Per attribute i, :func:`encrypt_attribute` with a fresh b_i; C0 = hd^s with
    s = sum b_i; K = KDF(Y^s, "payload" || id) seals the payload; Sig_i = P1_i * m^b_i
    with m = M(digest), the digest covering every P2_i too."""
    group, schema = pp.group, pp.schema
    epoch, paths, chosen = plan_publication(pp, keys, event)
    header = EventHeader(schema_id=schema.id, epoch=epoch, event_id=event.event_id,
                         publisher_credentials=tuple(k.credential for k in chosen))
    b, attributes, C0, Ys = encrypt_entries(pp, epoch, event.event_id, paths)
    header_bytes = encode_header(header)
    sealed = seal(payload_key(Ys, event.event_id), payload(event), header_bytes,
                  group.random_bytes(NONCE_BYTES))
    unsigned = [AttributeSignature(Sig=k.P1, P2=k.P2) for k in chosen]
    m = pp.M(signed_digest(header_bytes, C0, attributes, unsigned, sealed))
    signatures = tuple(AttributeSignature(Sig=k.P1 * group.exp_secret(m, b_i), P2=k.P2)
                       for k, b_i in zip(chosen, b, strict=True))
    return EncryptedEvent(header=header, C0=C0, attributes=attributes, sealed=sealed,
                          signatures=signatures)


def payload_key(Ys: Element, event_id: str) -> bytes:
    """K = KDF(Y^s, "payload" || event id)."""
    return KDF(Ys, b"payload" + _length_prefixed(event_id.encode()))


# -- Route test, decrypt, verify (report 6.3, eq. 7.1) -----------------------------------------

def _position_key(pp: PublicParams, token: RoutingToken | BlindedToken, event: AnyEvent,
                  known: PositionKeys | None = None) -> tuple[int, Element] | None:
    """(i, K_ij = e(T, C1_i)) when the token's tag matches R_ij, j the token's position;
    None otherwise. Only the header, C1_i and R_i are read (and C1_i checked). ``known``
    remembers e(T, C1_i) by (T, C1_i): a stream reuses C1_i across events."""
    j = token.position
    try:
        i = pp.schema.index(token.attribute)
        expected = pp.schema.attributes[i].positions
    except SchemaError:
        return None
    if i >= len(event.attributes):
        return None
    ct = event.attributes[i]
    if len(ct.R) != expected or j >= expected:
        return None
    K = _tag_key(pp, token, ct.C1, ct.R[j], known)
    return None if K is None else (i, K)


def _tag_key(pp: PublicParams, token: RoutingToken | BlindedToken, C1: Element, R: bytes,
             known: PositionKeys | None = None) -> Element | None:
    """K = e(T, C1) if H4(K) == R (C1 checked as a group element), else None; ``known``
    caches e(T, C1) (a stream's routers)."""
    cache_key = (bytes(token.T), bytes(C1))
    K = known.get(cache_key) if known is not None else None
    if K is None:
        try:
            K = pp.group.pair(token.T, C1)
        except GroupError:
            return None
        if known is not None:
            known.remember(cache_key, K)
    return K if mac_equal(H4(K), R) else None


def route_test(pp: PublicParams, token: RoutingToken | BlindedToken, event: AnyEvent,
               known: PositionKeys | None = None) -> bool:
    """Forward iff H4(e(T, C1_i)) == R_ij, j = position of the token's credential; ``known``
    caches e(T, C1_i) (a stream's routers)."""
    return (token.epoch == event.header.epoch
            and _position_key(pp, token, event, known) is not None)


def route_entry(pp: PublicParams, event: AnyEvent, attribute: str, position: int
                ) -> RouteEntry:
    """(epoch, C1_i, R_ij): the part of an event the route test at position j of attribute
    i reads, for a peer that lacks the event (raises SchemeError for a bad position)."""
    i = pp.schema.index(attribute)
    ct = event.attributes[i]
    if not 0 <= position < len(ct.R):
        raise SchemeError(f"no position {position} in attribute {attribute!r}")
    return RouteEntry(epoch=event.header.epoch, C1=ct.C1, R=ct.R[position])


def route_test_entry(pp: PublicParams, token: RoutingToken | BlindedToken, entry: RouteEntry
                     ) -> bool:
    """The route test on a route entry: H4(e(T, C1_i)) == R_ij, same epoch."""
    return token.epoch == entry.epoch and _tag_key(pp, token, entry.C1, entry.R) is not None


def check_publisher_credentials(pp: PublicParams, schema_id: str,
                                credentials: Sequence[Credential]) -> None:
    """Raise SchemeError unless ``credentials`` name one credential per attribute of this
    schema, in its order."""
    schema = pp.schema
    if schema_id != schema.id:
        raise SchemeError("event is for another schema")
    if len(credentials) != len(schema.attributes):
        raise SchemeError("event does not carry every attribute of the schema")
    for a, c in zip(schema.attributes, credentials, strict=True):
        if c.attribute != a.name or c.kind != a.kind:
            raise SchemeError(f"publisher credential {c} does not belong to {a.name!r}")


def check_structure(pp: PublicParams, event: AnyEvent) -> None:
    """Raise SchemeError unless the event has this schema's shape."""
    header = event.header
    check_publisher_credentials(pp, header.schema_id, header.publisher_credentials)
    if len(event.attributes) != len(pp.schema.attributes):
        raise SchemeError("event does not carry every attribute of the schema")
    for a, ct in zip(pp.schema.attributes, event.attributes, strict=True):
        if len(ct.R) != a.positions:
            raise SchemeError(f"attribute {a.name!r} carries {len(ct.R)} positions, "
                              f"not {a.positions}")


def unmask(pp: PublicParams, key: SubscriberKey, i: int, attribute: str, event: AnyEvent,
           mask_id: str, known: PositionKeys | None = None
           ) -> tuple[SubscriberCredentialKey, Element]:
    """The credential key on ``attribute`` whose tag matches (a subscriber's credentials on
    one attribute are disjoint), and C2 = E_ij XOR KDF(K_ij, "c2" || mask_id || i || j),
    checked as a G1 element; ``mask_id`` is the event id the entry was made for."""
    for k in key.for_attribute(attribute):
        found = _position_key(pp, k.token, event, known)
        if found is None:
            continue
        j = k.credential.position
        mask = KDF(found[1], _mask_info(mask_id, i, j), pp.group.sizes[G1])
        try:
            return k, pp.group.deserialize(G1, _xor(event.attributes[i].E[j], mask))
        except GroupError as exc:
            raise DecryptionError(f"unmasked C2 of {attribute!r} is not a G1 element") from exc
    raise DecryptionError(f"no credential on {attribute!r} matches the event")


def decrypt(pp: PublicParams, key: SubscriberKey, event: EncryptedEvent) -> Event:
    """Per attribute, the own token's route test gives K_ij and unmasks C2_{i,j}; then
    Y^s = e(D, C0) * prod_i e(C2_{i,j_i}, S2_i) / e(S1_i, C1_i), one multi-pairing;
    K = KDF(Y^s, ...), the AEAD, and the values against the header and the path."""
    check_structure(pp, event)
    header = event.header
    if header.epoch != key.epoch:
        raise DecryptionError(f"event of epoch {header.epoch}, keys of epoch {key.epoch}")
    pairs: list[tuple[Element, Element | PreparedG2]] = [(key.D, event.C0)]
    matched = []
    for i, (a, ct) in enumerate(zip(pp.schema.attributes, event.attributes, strict=True)):
        k, C2 = unmask(pp, key, i, a.name, event, header.event_id)
        matched.append(k.credential)
        pairs.append((C2, k.S2_prepared or k.S2))
        pairs.append((~k.S1, ct.C1))
    try:
        Ys = pp.group.multi_pair(pairs)
    except GroupError as exc:
        raise DecryptionError(f"malformed event: {exc}") from exc
    try:
        payload = open_sealed(payload_key(Ys, header.event_id), event.sealed,
                              encode_header(header))
    except AuthenticationFailed as exc:
        raise DecryptionError("payload does not open: credentials do not match") from exc
    return parse_payload(pp.schema, header, matched, payload)


def parse_payload(schema: Schema, header: EventHeader, matched: Sequence[Credential],
                  payload: bytes) -> Event:
    """The event sealed in ``payload``; its values must lie in the subscriber's ``matched``
    credentials and in the publisher credentials the header names."""
    event = _unpack_payload(schema, header.event_id, payload)
    for a, mine, theirs in zip(schema.attributes, matched, header.publisher_credentials,
                               strict=True):
        leaf = value_credential(schema, a.name, event.values[a.name])
        if not (mine.covers(leaf) and theirs.covers(leaf)):
            raise DecryptionError(f"value of {a.name!r} lies outside the credentials it names")
    return event


def _unpack_payload(schema: Schema, event_id: str, payload: bytes) -> Event:
    try:
        data = msgpack.unpackb(_unpad(payload), raw=False, max_bin_len=MAX_PAYLOAD,
                               max_str_len=MAX_PAYLOAD)
        values = schema.validate_values(data["v"])
        body = data["b"]
        if not isinstance(body, bytes):
            raise TypeError("body is not bytes")
    except (ValueError, TypeError, KeyError, msgpack.ExtraData) as exc:
        raise DecryptionError(f"malformed payload: {exc}") from exc
    return Event(event_id=event_id, values=values, body=body)


def verify(pp: PublicParams, event: EncryptedEvent) -> bool:
    """Batch check of e(Sig_i, ĝ) = Y * e(F(Pu_PUB(A_i, p_i)), P2_i) * e(m, C1_i) with 64-bit
    weights: e(prod Sig_i^w_i, ĝ) = Y^(sum w_i) * prod e(F_i^w_i, P2_i) * e(m, prod C1_i^w_i)."""
    try:
        check_structure(pp, event)
        header = event.header
        m = pp.M(signed_digest(encode_header(header), event.C0, event.attributes,
                                event.signatures, event.sealed))
        return batch_verify(pp, m, header.epoch, header.publisher_credentials,
                            [s.Sig for s in event.signatures], [s.P2 for s in event.signatures],
                            [a.C1 for a in event.attributes])
    except (SchemeError, GroupError):
        return False


def batch_verify(pp: PublicParams, m: Element, epoch: int, credentials: Sequence[Credential],
                 Sig: Sequence[Element], P2: Sequence[Element], C1: Sequence[Element]) -> bool:
    """e(Sig_i, ĝ) = Y * e(F(Pu_PUB(A_i, p_i)), P2_i) * e(m, C1_i) for every i, checked at
    once with 64-bit weights w_i:
    e(prod Sig_i^w_i, ĝ) = Y^(sum w_i) * prod e(F_i^w_i, P2_i) * e(m, prod C1_i^w_i).
    Raises GroupError on a malformed element."""
    group = pp.group
    w = [secrets.randbits(BATCH_WEIGHT_BITS) | 1 for _ in Sig]
    pairs: list[tuple[Element, Element | PreparedG2]] = [(group.multi_exp(list(Sig), w),
                                                          pp.g_hat)]
    for c, P2_i, w_i in zip(credentials, P2, w, strict=True):
        F = pp.F(identity_string(c.attribute, PUB, epoch, c))
        pairs.append((~(F ** w_i), P2_i))
    pairs.append((~m, group.multi_exp(list(C1), w)))
    return group.multi_pair(pairs) == pp.mpk.Y ** sum(w)


# -- Connection requests (report 7.3, Algorithm 2) ----------------------------------------------

def _request_ad(attribute: str, epoch: int, position: int) -> bytes:
    return _length_prefixed(b"connection-request", attribute.encode(), epoch.to_bytes(8, "big"),
                            position.to_bytes(2, "big"))


#: KDF info of a request entry's key.
REQUEST_INFO = b"cr"
#: SW, then the requester's position (2 bytes), sealed in each real entry.
REQUEST_PLAINTEXT_BYTES = SW_BYTES + 2


class _Draws(Protocol):
    """Where a connection request's randomness comes from: fresh (version 2) or a PRF of a
    seed (version 3, so that every member builds the same request)."""

    def scalar(self, *label: bytes) -> int: ...

    def bytes(self, length: int, *label: bytes) -> bytes: ...


@dataclass(frozen=True)
class _Fresh:
    group: PairingGroup

    def scalar(self, *_: bytes) -> int:
        return self.group.random_scalar()

    def bytes(self, length: int, *_: bytes) -> bytes:
        return self.group.random_bytes(length)


@dataclass(frozen=True)
class _Seeded:
    group: PairingGroup
    key: bytes

    def scalar(self, *label: bytes) -> int:
        return prf_scalar(self.group, self.key, *label)

    def bytes(self, length: int, *label: bytes) -> bytes:
        return prf_bytes(self.key, length, *label)


#: Bytes of a version-3 request seed (:func:`derive_connection_request`).
REQUEST_SEED_BYTES = 32


def _unsigned_request(pp: PublicParams, credential: Credential, epoch: int, expires_at: int,
                      draw: _Draws, binding: Element | None = None
                      ) -> tuple[ConnectionRequest, tuple[bytes, ...]]:
    """For each c' covering c (position j = len(c')), t and SW from ``draw``:
    CR_c' = (U = ĝ^t, AEAD_{KDF(e(F(Pu_SUB(A, c')), h)^t, "cr")}(SW || len(c)));
    random entries (U = ĝ^r, a random box) for the deeper positions; no signature yet."""
    group = pp.group
    attribute = pp.schema.attribute(credential.attribute)
    position = credential.position.to_bytes(2, "big")
    entries, sws = [], []
    for j, c in enumerate(credential.ancestors()):
        at = j.to_bytes(2, "big")
        t, sw = draw.scalar(b"t", at), draw.bytes(SW_BYTES, b"sw", at)
        K = pp.F_h(identity_string(c.attribute, SUB, epoch, c)) ** t
        entries.append(RequestEntry(
            U=group.exp_secret(pp.mpk.g_hat, t),
            sealed=seal(KDF(K, REQUEST_INFO), sw + position,
                        _request_ad(c.attribute, epoch, j), draw.bytes(NONCE_BYTES, b"nonce", at))))
        sws.append(sw)
    sealed_size = len(entries[0].sealed)
    for j in range(len(entries), attribute.positions):
        at = j.to_bytes(2, "big")
        entries.append(RequestEntry(U=group.exp_secret(group.generator(G2),
                                                       draw.scalar(b"padding", at)),
                                    sealed=draw.bytes(sealed_size, b"padding box", at)))
    return ConnectionRequest(attribute=credential.attribute, epoch=epoch, expires_at=expires_at,
                             nonce=draw.bytes(16, b"request nonce"), entries=tuple(entries),
                             signature=b"", binding=binding), tuple(sws)


def build_connection_request(pp: PublicParams, signing_key: Ed25519PrivateKey,
                             credential: Credential, epoch: int, expires_at: int
                             ) -> tuple[ConnectionRequest, tuple[bytes, ...]]:
    """Version 2: the entries with fresh t and SW; the key server signs the whole request
    (Ed25519). Returns the SWs of the real entries too."""
    unsigned, sws = _unsigned_request(pp, credential, epoch, expires_at, _Fresh(pp.group))
    return replace(unsigned, signature=signing_key.sign(encode_request_body(unsigned))), sws


def derive_connection_request(pp: PublicParams, requester: str, credential: Credential,
                              epoch: int, expires_at: int, seed: bytes, binding: Element
                              ) -> tuple[ConnectionRequest, tuple[bytes, ...]]:
    """Version 3: the same entries with every t, SW, nonce and padding drawn from
    ``k = PRF(seed; "connection-request", requester, A, c, epoch, expiry)``, so that every
    member given the requester's seed builds the same bytes, and signs them only for a
    credential that identity may hold (the requester knows its own SWs and t's, as in
    version 2 it knows the SWs). The identity in ``k`` keeps requests of two identities
    apart, so identities that each get fewer than ``t`` signatures cannot pool them.
    Unsigned: the members' partial signatures of :func:`encode_request_body` combine into
    its signature. ``binding`` is the requester's ``V = ĝ^s``; the request carries
    ``V_c = V^h_c`` with ``h_c = PRF_q(k; "binding")``, so that the requests of one
    enrolment share no bytes (a peer without the seed cannot link them). The returned SWs
    are the members' (unbound); the requester binds them with :func:`bind_request_secrets`
    and ``s_c = s h_c`` (:func:`requester_view`)."""
    draw = _Seeded(pp.group, _request_key(requester, credential, epoch, expires_at, seed))
    return _unsigned_request(pp, credential, epoch, expires_at, draw,
                             pp.group.exp_secret(binding, draw.scalar(b"binding")))


@dataclass(frozen=True)
class RequesterView:
    """What the requester of a version-3 request derives from its seed and ``s`` without
    building the request: its SWs (unbound), ``s_c = s h_c`` and the binding
    ``V_c = ĝ^s_c`` it carries, and entry 0's ``U = ĝ^t_0``, to check a body others built."""

    sws: tuple[bytes, ...]
    s_c: int
    binding: Element
    first_U: Element

    def matches(self, request: ConnectionRequest) -> bool:
        """A spot check of a body others derived from the seed: its binding, and entry 0
        (so that requests built otherwise, by members of another release, are found at
        enrolment rather than at the first join)."""
        return (request.binding is not None and bool(request.entries)
                and bytes(request.binding) == bytes(self.binding)
                and bytes(request.entries[0].U) == bytes(self.first_U))


def requester_view(pp: PublicParams, requester: str, credential: Credential, epoch: int,
                   expires_at: int, seed: bytes, s: int) -> RequesterView:
    """:class:`RequesterView` of the request :func:`derive_connection_request` builds from
    ``seed`` and ``V = ĝ^s``: ``SW_j = PRF(k; "sw", j)``, ``s_c = s PRF_q(k; "binding")``,
    two G2 exponentiations."""
    group = pp.group
    draw = _Seeded(group, _request_key(requester, credential, epoch, expires_at, seed))
    s_c = s * draw.scalar(b"binding") % group.order
    return RequesterView(
        sws=tuple(draw.bytes(SW_BYTES, b"sw", j.to_bytes(2, "big"))
                  for j in range(len(credential.ancestors()))),
        s_c=s_c, binding=group.exp_secret(pp.mpk.g_hat, s_c),
        first_U=group.exp_secret(pp.mpk.g_hat, draw.scalar(b"t", (0).to_bytes(2, "big"))))


def _request_key(requester: str, credential: Credential, epoch: int, expires_at: int,
                 seed: bytes) -> bytes:
    """``k = PRF(seed; "connection-request", requester, A, c, epoch, expiry)``."""
    if len(seed) != REQUEST_SEED_BYTES:
        raise SchemeError(f"a request seed is {REQUEST_SEED_BYTES} bytes")
    return prf_bytes(seed, 32, b"connection-request", requester.encode(),
                     credential.attribute.encode(), credential.encode(),
                     epoch.to_bytes(8, "big"), int(expires_at).to_bytes(8, "big"))


def _bound(sw: bytes, B: Element) -> bytes:
    """SW' = KDF(B, "cr-bind/" || SW): the secret an opener proves with."""
    return KDF(B, b"cr-bind/" + sw)


def bind_request_secrets(pp: PublicParams, credential: Credential, epoch: int,
                         sws: Sequence[bytes], s: int) -> tuple[bytes, ...]:
    """The requester's SWs of a bound request (``V = ĝ^s``): for each prefix c'_j,
    ``SW'_j = KDF(e(F(Pu_SUB(A, c'_j)), h)^s, "cr-bind/" || SW_j)``, which an opener holding
    the token ``T`` of c'_j computes as ``e(T, V)`` and nobody without it can."""
    return tuple(_bound(sw, pp.F_h(identity_string(c.attribute, SUB, epoch, c)) ** s)
                 for sw, c in zip(sws, credential.ancestors(), strict=True))


def check_connection_request(pp: PublicParams, request: ConnectionRequest,
                             server: ServerVerifier, now: float,
                             epochs: Collection[int]) -> None:
    """Raise :class:`RequestRejected` unless the key server (or ``t`` members of a threshold
    deployment) signed it, for a schema attribute, an accepted epoch, not expired, with one
    entry per position of the attribute."""
    try:
        signed = server.verify(encode_request_body(request), request.signature)
    except CodecError:
        signed = False
    if not signed:
        raise RequestRejected("connection request signature does not verify")
    try:
        attribute = pp.schema.attribute(request.attribute)
    except SchemaError as exc:
        raise RequestRejected(str(exc)) from exc
    if request.epoch not in epochs:
        raise RequestRejected(f"connection request of epoch {request.epoch} is not accepted")
    if request.expires_at < now:
        raise RequestRejected("connection request expired")
    if len(request.entries) != attribute.positions:
        raise RequestRejected("connection request has an impossible number of entries")


def open_connection_request(pp: PublicParams, token: RoutingToken | BlindedToken,
                            request: ConnectionRequest) -> RequestOpening | None:
    """Try the entry at position len(c_r): e(T_r, U) = e(F(c_r), h)^t gives its key.
    The SW (in a bound request ``KDF(e(T_r, V), "cr-bind/" || SW)``) and the requester's
    position iff the holder's credential covers the requester's, else None."""
    j = token.position
    if token.attribute != request.attribute or token.epoch != request.epoch or j >= len(
            request.entries):
        return None
    entry = request.entries[j]
    try:
        K = pp.group.pair(token.T, entry.U)
        plain = open_sealed(KDF(K, REQUEST_INFO), entry.sealed,
                            _request_ad(token.attribute, request.epoch, j))
    except (GroupError, AuthenticationFailed):
        return None
    position = int.from_bytes(plain[SW_BYTES:], "big")
    if len(plain) != REQUEST_PLAINTEXT_BYTES or position < j:
        return None
    sw = plain[:SW_BYTES]
    if request.binding is not None:
        try:
            if request.binding == pp.group.identity(G2):
                return None  # binds nothing: the members could prove with SW alone
            sw = _bound(sw, pp.group.pair(token.T, request.binding))
        except GroupError:
            return None
    return RequestOpening(sw=sw, position=position)


def acceptance_proof(sw: bytes, request: ConnectionRequest, context: bytes) -> bytes:
    """HMAC under SW that proves the acceptor opened the request (bound to ``context``)."""
    return mac(sw, b"accept", hashlib.sha256(encode_request(request)).digest(), context)


def check_acceptance(sws: Sequence[bytes], request: ConnectionRequest, proof: bytes,
                     context: bytes) -> int | None:
    """The position whose SW produced ``proof``, or None if none did."""
    for position, sw in enumerate(sws):
        if mac_equal(acceptance_proof(sw, request, context), proof):
            return position
    return None
