"""The algorithms of SCHEME.md, one function each, named after the algorithm.

Notation follows SCHEME.md: multiplicative groups, ``**`` for exponentiation,
``F`` hashes identity strings onto G1, ``M`` hashes the signed digest onto G1.
:class:`PublicParams` carries what every peer has (group, MPK, schema) plus the
per-epoch caches of ``F(c)`` and ``e(F(c), h)`` that make encryption cheap.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from credentials.codec import CodecError, Writer, encode_header, encode_request, encode_request_body
from credentials.credential import Credential
from credentials.decompose import enclosing_path, value_credential
from credentials.groups import G1, G2, Element, PairingGroup, PreparedG2
from credentials.keys import (
    BlindedToken,
    MasterPublicKey,
    MasterSecretKey,
    PublisherKey,
    RoutingToken,
    SubscriberCredentialKey,
    SubscriberKey,
)
from credentials.messages import (
    AttributeCiphertext,
    AttributeSignature,
    ConnectionRequest,
    EncryptedEvent,
    EventHeader,
    RequestEntry,
)
from credentials.schema import Schema, SchemaError
from credentials.symmetric import H4, KDF, AuthenticationFailed, mac, mac_equal, open_sealed, seal

PUB, SUB = "PUB", "SUB"
DST_ID = b"ibe-pubsub/v1/ID"
DST_MSG = b"ibe-pubsub/v1/MSG"
BATCH_WEIGHT_BITS = 64
SW_BYTES = 32
MAX_PAYLOAD = 8 * 1024 * 1024


class SchemeError(ValueError):
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
        raise ValueError(f"role must be PUB or SUB, not {role!r}")
    return _length_prefixed(attribute.encode(), role.encode(), epoch.to_bytes(8, "big"),
                            credential.encode())


class _LRU(OrderedDict[bytes, Element]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: bytes, value: Element) -> Element:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)
        return value


class PublicParams:
    """Group, master public key and schema, with the precomputations every peer reuses."""

    def __init__(self, group: PairingGroup, mpk: MasterPublicKey, schema: Schema,
                 cache_size: int = 32768) -> None:
        self.group = group
        self.mpk = mpk
        self.schema = schema
        self.g_hat = group.prepare(mpk.g_hat)
        self.h = group.prepare(mpk.h)
        self._f: _LRU = _LRU(cache_size)
        self._f_h: _LRU = _LRU(cache_size)

    def F(self, identity: bytes) -> Element:
        """F(s): hash onto G1 with domain tag ID (cached)."""
        cached = self._f.get(identity)
        if cached is not None:
            self._f.move_to_end(identity)
            return cached
        return self._f.remember(identity, self.group.hash_to_g1(DST_ID + identity))

    def F_h(self, identity: bytes) -> Element:
        """e(F(s), h) (cached): turns the per-position pairing of encryption into a GT power."""
        cached = self._f_h.get(identity)
        if cached is not None:
            self._f_h.move_to_end(identity)
            return cached
        return self._f_h.remember(identity, self.group.pair(self.F(identity), self.h))

    def M(self, digest: bytes) -> Element:
        """M(d): hash onto G1 with domain tag MSG."""
        return self.group.hash_to_g1(DST_MSG + digest)


# -- Setup (Algorithm 1) --------------------------------------------------------------------

def setup(group: PairingGroup) -> tuple[MasterPublicKey, MasterSecretKey]:
    """alpha, phi, y in Zq*; g2 = g^y; h = ĝ^phi; Y = e(g2, ĝ)^alpha."""
    alpha, phi, y = (group.random_scalar() for _ in range(3))
    g, g_hat = group.generator(G1), group.generator(G2)
    g2 = g ** y
    mpk = MasterPublicKey(curve=group.curve, g=g, g_hat=g_hat, g2=g2, h=g_hat ** phi,
                          Y=group.pair(g2, g_hat) ** alpha)
    return mpk, MasterSecretKey(alpha=alpha, phi=phi)


# -- Key generation (eq. 6.2, 6.4) ------------------------------------------------------------

def keygen_publisher(pp: PublicParams, msk: MasterSecretKey, credential: Credential,
                     epoch: int) -> PublisherKey:
    """P1 = g2^alpha * F(Pu_PUB(A, c))^gamma, P2 = ĝ^gamma."""
    group, mpk = pp.group, pp.mpk
    gamma = group.random_scalar()
    F = pp.F(identity_string(credential.attribute, PUB, epoch, credential))
    return PublisherKey(credential=credential, epoch=epoch,
                        P1=group.multi_exp([mpk.g2, F], [msk.alpha, gamma]),
                        P2=mpk.g_hat ** gamma)


def keygen_routing_token(pp: PublicParams, msk: MasterSecretKey, credential: Credential,
                         epoch: int) -> RoutingToken:
    """T = F(Pu_SUB(A, c))^phi (Pr^s[3])."""
    F = pp.F(identity_string(credential.attribute, SUB, epoch, credential))
    return RoutingToken(credential=credential, epoch=epoch, T=F ** msk.phi)


def keygen_subscriber(pp: PublicParams, msk: MasterSecretKey, epoch: int,
                      credentials: Sequence[Credential],
                      fine_credentials: Sequence[Credential] = ()) -> SubscriberKey:
    """One gamma_s binds them all: D = g2^((gamma_s + alpha) / phi); per credential, fresh gamma:
    S1 = g2^gamma_s * F^gamma, S2 = ĝ^gamma, T = F^phi; and T for each fine credential."""
    group, mpk = pp.group, pp.mpk
    q = group.order
    gamma_s = group.random_scalar()
    D = mpk.g2 ** ((gamma_s + msk.alpha) * pow(msk.phi, -1, q))
    keys = []
    for c in credentials:
        gamma = group.random_scalar()
        F = pp.F(identity_string(c.attribute, SUB, epoch, c))
        keys.append(SubscriberCredentialKey(
            credential=c, epoch=epoch, S1=group.multi_exp([mpk.g2, F], [gamma_s, gamma]),
            S2=mpk.g_hat ** gamma, T=F ** msk.phi))
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


def _payload(event: Event) -> bytes:
    return msgpack.packb({"v": event.values, "b": event.body}, use_bin_type=True)


def _signed_digest(header_bytes: bytes, C0: Element,
                   attributes: Sequence[AttributeCiphertext], sealed: bytes) -> bytes:
    """SHA-256(header || every ciphertext component || sealed payload)."""
    w = Writer(0).blob(header_bytes).element(C0)
    for a in attributes:
        w.element(a.C1).many(a.C2, Writer.element).many(a.R, Writer.fixed)
    return hashlib.sha256(w.blob(sealed).done()).digest()


def encrypt_and_sign(pp: PublicParams, keys: Sequence[PublisherKey], event: Event
                     ) -> EncryptedEvent:
    """Per attribute i: C1_i = ĝ^b_i, C2_ij = F(Pu_SUB(A_i, c_j))^b_i, R_ij = H4(e(F, h)^b_i);
    C0 = h^s with s = sum b_i; K = KDF(Y^s, id); Sig_i = P1_i * m^b_i with m = M(digest)."""
    group, mpk, schema = pp.group, pp.mpk, pp.schema
    if not keys:
        raise NotAuthorized("no publisher keys")
    epoch = keys[0].epoch
    if any(k.epoch != epoch for k in keys):
        raise NotAuthorized("publisher keys of different epochs")
    try:
        values = schema.validate_values(event.values)
    except SchemaError as exc:
        raise NotAuthorized(str(exc)) from exc
    paths = [enclosing_path(schema, a.name, values[a.name]) for a in schema.attributes]
    chosen = [publisher_key_for(keys, path[-1]) for path in paths]
    header = EventHeader(schema_id=schema.id, epoch=epoch, event_id=event.event_id,
                         publisher_credentials=tuple(k.credential for k in chosen))
    b = [group.random_scalar() for _ in schema.attributes]
    attributes = []
    for a, path, b_i in zip(schema.attributes, paths, b, strict=True):
        ids = [identity_string(a.name, SUB, epoch, c) for c in path]
        attributes.append(AttributeCiphertext(
            C1=mpk.g_hat ** b_i,
            C2=tuple(pp.F(i) ** b_i for i in ids),
            R=tuple(H4(pp.F_h(i) ** b_i) for i in ids)))
    s = sum(b) % group.order
    C0 = mpk.h ** s
    header_bytes = encode_header(header)
    sealed = seal(KDF(mpk.Y ** s, event.event_id.encode()), _payload(event), header_bytes)
    m = pp.M(_signed_digest(header_bytes, C0, attributes, sealed))
    signatures = tuple(AttributeSignature(Sig=k.P1 * m ** b_i, P2=k.P2)
                       for k, b_i in zip(chosen, b, strict=True))
    return EncryptedEvent(header=header, C0=C0, attributes=tuple(attributes), sealed=sealed,
                          signatures=signatures)


# -- Route test, decrypt, verify (report 6.3, eq. 7.1) -----------------------------------------

def route_test(pp: PublicParams, token: RoutingToken | BlindedToken, event: EncryptedEvent
               ) -> bool:
    """Forward iff H4(e(T, C1_i)) == R_ij, j = position of the token's credential."""
    try:
        i = pp.schema.index(token.attribute)
    except SchemaError:
        return False
    if i >= len(event.attributes):
        return False
    ct = event.attributes[i]
    j = token.position
    if j >= len(ct.R):
        return False
    return mac_equal(H4(pp.group.pair(token.T, ct.C1)), ct.R[j])


def _matching_key(pp: PublicParams, key: SubscriberKey, attribute: str,
                  ct: AttributeCiphertext) -> SubscriberCredentialKey:
    """The one credential key on ``attribute`` that encloses the value (a subscriber's
    credentials on one attribute are disjoint). A lone candidate is not route-tested: the AEAD
    rejects it if it does not match, which saves a pairing on the common path."""
    candidates = [k for k in key.for_attribute(attribute) if k.credential.position < len(ct.R)]
    if len(candidates) == 1:
        return candidates[0]
    for k in candidates:
        if mac_equal(H4(pp.group.pair(k.T, ct.C1)), ct.R[k.credential.position]):
            return k
    raise DecryptionError(f"no credential on {attribute!r} matches the event")


def _check_structure(pp: PublicParams, event: EncryptedEvent) -> None:
    schema, header = pp.schema, event.header
    if header.schema_id != schema.id:
        raise SchemeError("event is for another schema")
    if len(event.attributes) != len(schema.attributes):
        raise SchemeError("event does not carry every attribute of the schema")
    for a, c in zip(schema.attributes, header.publisher_credentials, strict=True):
        if c.attribute != a.name or c.kind != a.kind:
            raise SchemeError(f"publisher credential {c} does not belong to {a.name!r}")


def decrypt(pp: PublicParams, key: SubscriberKey, event: EncryptedEvent) -> Event:
    """Y^s = e(D, C0) * prod_i e(C2_{i,j_i}, S2_i) / e(S1_i, C1_i), one multi-pairing;
    then K = KDF(Y^s, id), the AEAD, and the values against the header and the path."""
    _check_structure(pp, event)
    header = event.header
    if header.epoch != key.epoch:
        raise DecryptionError(f"event of epoch {header.epoch}, keys of epoch {key.epoch}")
    pairs: list[tuple[Element, Element | PreparedG2]] = [(key.D, event.C0)]
    matched = []
    for a, ct in zip(pp.schema.attributes, event.attributes, strict=True):
        k = _matching_key(pp, key, a.name, ct)
        matched.append(k.credential)
        pairs.append((ct.C2[k.credential.position], k.S2_prepared or k.S2))
        pairs.append((~k.S1, ct.C1))
    K = KDF(pp.group.multi_pair(pairs), header.event_id.encode())
    try:
        payload = open_sealed(K, event.sealed, encode_header(header))
    except AuthenticationFailed as exc:
        raise DecryptionError("payload does not open: credentials do not match") from exc
    event_out = _parse_payload(pp.schema, header.event_id, payload)
    for a, mine, theirs in zip(pp.schema.attributes, matched, header.publisher_credentials,
                               strict=True):
        leaf = value_credential(pp.schema, a.name, event_out.values[a.name])
        if not (mine.covers(leaf) and theirs.covers(leaf)):
            raise DecryptionError(f"value of {a.name!r} lies outside the credentials it names")
    return event_out


def _parse_payload(schema: Schema, event_id: str, payload: bytes) -> Event:
    try:
        data = msgpack.unpackb(payload, raw=False, max_bin_len=MAX_PAYLOAD,
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
        _check_structure(pp, event)
    except SchemeError:
        return False
    group, header = pp.group, event.header
    m = pp.M(_signed_digest(encode_header(header), event.C0, event.attributes, event.sealed))
    w = [secrets.randbits(BATCH_WEIGHT_BITS) | 1 for _ in event.signatures]
    pairs: list[tuple[Element, Element | PreparedG2]] = [
        (group.multi_exp([s.Sig for s in event.signatures], w), pp.g_hat)]
    for c, s, w_i in zip(header.publisher_credentials, event.signatures, w, strict=True):
        F = pp.F(identity_string(c.attribute, PUB, header.epoch, c))
        pairs.append((~(F ** w_i), s.P2))
    pairs.append((~m, group.multi_exp([a.C1 for a in event.attributes], w)))
    return group.multi_pair(pairs) == pp.mpk.Y ** sum(w)


# -- Connection requests (report 7.3, Algorithm 2) ----------------------------------------------

def _request_ad(attribute: str, epoch: int, position: int) -> bytes:
    return _length_prefixed(b"connection-request", attribute.encode(), epoch.to_bytes(8, "big"),
                            position.to_bytes(2, "big"))


def build_connection_request(pp: PublicParams, signing_key: Ed25519PrivateKey,
                             credential: Credential, epoch: int, expires_at: int
                             ) -> tuple[ConnectionRequest, tuple[bytes, ...]]:
    """For each c' covering c, fresh t and SW: CR_c' = (ĝ^t, F(Pu_SUB(A, c'))^t, h^t,
    AEAD_{KDF(Y^t)}(SW)); the key server signs the whole request. Returns the SWs too."""
    mpk, group = pp.mpk, pp.group
    entries, sws = [], []
    for position, c in enumerate(credential.ancestors()):
        t, sw = group.random_scalar(), os.urandom(SW_BYTES)
        F = pp.F(identity_string(c.attribute, SUB, epoch, c))
        key = KDF(mpk.Y ** t, b"connection-request")
        entries.append(RequestEntry(
            g_hat_t=mpk.g_hat ** t, F_t=F ** t, h_t=mpk.h ** t,
            sealed_sw=seal(key, sw, _request_ad(c.attribute, epoch, position))))
        sws.append(sw)
    unsigned = ConnectionRequest(attribute=credential.attribute, epoch=epoch,
                                 expires_at=expires_at, nonce=os.urandom(16),
                                 entries=tuple(entries), signature=b"")
    signature = signing_key.sign(encode_request_body(unsigned))
    return replace(unsigned, signature=signature), tuple(sws)


def check_connection_request(pp: PublicParams, request: ConnectionRequest,
                             server_key: Ed25519PublicKey, now: float,
                             epochs: Collection[int]) -> None:
    """Raise :class:`RequestRejected` unless the key server signed it, for a schema attribute,
    an accepted epoch, not expired, with no more entries than the attribute has positions."""
    try:
        server_key.verify(request.signature, encode_request_body(request))
    except (InvalidSignature, CodecError) as exc:
        raise RequestRejected("connection request signature does not verify") from exc
    try:
        attribute = pp.schema.attribute(request.attribute)
    except SchemaError as exc:
        raise RequestRejected(str(exc)) from exc
    if request.epoch not in epochs:
        raise RequestRejected(f"connection request of epoch {request.epoch} is not accepted")
    if request.expires_at < now:
        raise RequestRejected("connection request expired")
    max_positions = attribute.bits + 1 if attribute.is_numeric else attribute.max_length + 2
    if not 0 < len(request.entries) <= max_positions:
        raise RequestRejected("connection request has an impossible number of entries")


def open_connection_request(pp: PublicParams, D: Element, key: SubscriberCredentialKey,
                            request: ConnectionRequest) -> bytes | None:
    """Try the entry at position len(c_r): Y^t = e(D, h^t) * e(F^t, S2) / e(S1, ĝ^t).
    Returns SW iff the holder's credential covers the requester's, else None."""
    c = key.credential
    j = c.position
    if c.attribute != request.attribute or key.epoch != request.epoch or j >= len(
            request.entries):
        return None
    e = request.entries[j]
    Yt = pp.group.multi_pair([(D, e.h_t), (e.F_t, key.S2_prepared or key.S2),
                              (~key.S1, e.g_hat_t)])
    try:
        return open_sealed(KDF(Yt, b"connection-request"), e.sealed_sw,
                           _request_ad(c.attribute, request.epoch, j))
    except AuthenticationFailed:
        return None


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
