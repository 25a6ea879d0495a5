"""Streams (docs/scheme.md, version 2.2): an optional publisher mode for high event rates,
one function per algorithm, named after it.

A publisher running a stream certifies an ephemeral Ed25519 key once per session (an
identity-based signature by its publisher keys, verified like an event signature), signs
every event with that key, and reuses the whole header (every attribute's entry
``(C1_i, E_i, R_i)`` with ``C0`` and ``Y^s``) while every value's credential path is
unchanged and the reuse window is open; any change draws fresh ``b_i`` for every
attribute. Reusing entries one attribute at a time (version 2.1) let two subscribers pool
their keys to read an event neither matches (docs/scheme.md, 15.2). Routers and
subscribers remember what a reused header cost them, in bounded caches per epoch
(:class:`StreamCaches`), so a fully reused event costs a subscriber one Ed25519
verification and one AEAD. Events sharing a header are linkable by their cells, and the
events of one session by ``vk``: the known limits in docs/scheme.md say so.

The certificate travels in full in every event, next to its hash in the signed header: a
peer that has verified it looks it up by the hash and ignores the copy; one that has not
(it joined mid-stream, or its cache evicted it) verifies the copy, so no event is lost for
want of a certificate. The price is the certificate's size on every event (893 bytes on
the stock schema: a stream event is 5.7 kB, a version 2 event 5.1 kB).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ibe_pubsub.credentials.codec import (
    decode_certificate,
    encode_certificate,
    encode_certificate_body,
    encode_stream_header,
)
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.groups import Element, GroupError, PreparedG2
from ibe_pubsub.credentials.keys import PublisherKey, SubscriberCredentialKey, SubscriberKey
from ibe_pubsub.credentials.lru import LRU
from ibe_pubsub.credentials.messages import (
    AttributeCiphertext,
    CertificatePart,
    EventHeader,
    SessionCertificate,
    StreamEvent,
)
from ibe_pubsub.credentials.scheme import (
    DecryptionError,
    Entries,
    Event,
    NotAuthorized,
    PositionKeys,
    PublicParams,
    SchemeError,
    batch_verify,
    check_publisher_credentials,
    check_structure,
    encrypt_entries,
    encrypt_entries_steps,
    parse_payload,
    payload,
    payload_key,
    plan_publication,
    signed_digest,
    unmask,
)
from ibe_pubsub.credentials.symmetric import NONCE_BYTES, AuthenticationFailed, open_sealed, seal

#: Entries per cache, per epoch (each cache of each epoch holds at most this many).
CACHE_SIZE = 4096
#: Epochs with caches at once: the one in its grace period, the current one, the next, and
#: one to spare.
MAX_EPOCHS = 4


def entry_mask_id(certificate_hash: bytes) -> str:
    """The id a stream entry's masks are bound to, in place of an event id: an entry
    outlives the event it was made for (K_ij is fresh with every b_i, so no mask repeats),
    and it belongs to one session, so another session's certificate cannot carry it."""
    return "stream-entry/" + certificate_hash.hex()



@dataclass(frozen=True)
class StreamWindow:
    """How long an entry may be reused: ``seconds``, and at most ``max_events`` events
    (None: no limit on the count)."""

    seconds: float
    max_events: int | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise SchemeError("a stream window must last more than 0 seconds")
        if self.max_events is not None and self.max_events < 1:
            raise SchemeError("a stream window must allow at least one event")


# -- Session certificate ------------------------------------------------------------------------

def certificate_message(pp: PublicParams, certificate: SessionCertificate) -> Element:
    """m_c = M(SHA-256(vk || epoch || expiry || schema id || every p_i))."""
    return pp.M(hashlib.sha256(encode_certificate_body(certificate)).digest())


def issue_session_certificate(pp: PublicParams, keys: Sequence[PublisherKey], vk: bytes,
                              expires_at: int) -> SessionCertificate:
    """Per attribute r_i in Zq*; m_c = M(SHA-256(vk || epoch || expiry || schema id ||
    every p_i)); Cert_i = (P1_i * m_c^r_i, P2_i, ĝ^r_i), with ``keys`` the p_i's keys."""
    group = pp.group
    unsigned = SessionCertificate(vk=vk, epoch=keys[0].epoch, expires_at=expires_at,
                                  schema_id=pp.schema.id,
                                  publisher_credentials=tuple(k.credential for k in keys),
                                  parts=())
    m_c = certificate_message(pp, unsigned)
    parts = []
    for k in keys:
        r = group.random_scalar()
        parts.append(CertificatePart(Sig=k.P1 * group.exp_secret(m_c, r), P2=k.P2,
                                     R=group.exp_secret(pp.mpk.g_hat, r)))
    return replace(unsigned, parts=tuple(parts))


def verify_session_certificate(pp: PublicParams, certificate: SessionCertificate) -> bool:
    """e(Cert_i1, ĝ) = Y * e(F(Pu_PUB(A_i, p_i)), P2_i) * e(m_c, ĝ^r_i) for every i,
    batched with random 64-bit weights (:func:`credentials.scheme.batch_verify`)."""
    c = certificate
    try:
        check_publisher_credentials(pp, c.schema_id, c.publisher_credentials)
        if len(c.parts) != len(c.publisher_credentials):
            return False
        m_c = certificate_message(pp, c)
        return batch_verify(pp, m_c, c.epoch, c.publisher_credentials,
                            [p.Sig for p in c.parts], [p.P2 for p in c.parts],
                            [p.R for p in c.parts])
    except (SchemeError, GroupError):
        return False


# -- The publisher: reuse state and stream encryption ---------------------------------------------

@dataclass
class _Header:
    """The last event's entries ``(path_i, C1_i, E_i, R_i)`` for every attribute, with
    ``C0`` and ``Y^s``, and its window. The b_i are not kept: nothing needs them once C0
    and Y^s are computed."""

    paths: tuple[tuple[Credential, ...], ...]
    attributes: tuple[AttributeCiphertext, ...]
    C0: Element
    Ys: Element
    opened_at: float
    uses: int = 1


@dataclass
class _Spare:
    """A fresh header for ``paths`` (epoch, session's mask id) prepared ahead, a position at a
    time: ``steps`` (which hold the b_i) until done, then ``entries`` (the header's
    ``C1_i, E_i, R_i``, ``C0`` and ``Y^s``; the b_i are dropped)."""

    paths: tuple[tuple[Credential, ...], ...]
    epoch: int
    mask_id: str
    steps: Generator[None, None, Entries] = field(repr=False)
    entries: tuple[tuple[AttributeCiphertext, ...], Element, Element] | None = field(
        default=None, repr=False)

    def serves(self, paths: tuple[tuple[Credential, ...], ...], epoch: int, mask_id: str
               ) -> bool:
        return (self.paths, self.epoch, self.mask_id) == (paths, epoch, mask_id)


@dataclass(frozen=True)
class Session:
    """A stream's session: its Ed25519 key and the certificate over it, encoded, with the
    hash of that encoding (what the header carries)."""

    signing_key: Ed25519PrivateKey
    certificate: SessionCertificate
    encoded: bytes
    certificate_hash: bytes
    vk: bytes

    @classmethod
    def of(cls, signing_key: Ed25519PrivateKey, certificate: SessionCertificate) -> Session:
        encoded = encode_certificate(certificate)
        return cls(signing_key, certificate, encoded, hashlib.sha256(encoded).digest(),
                   signing_key.public_key().public_bytes_raw())


@dataclass
class Stream:
    """A publisher's stream: the session (Ed25519 key and certificate) and the last event's
    header. A new session starts when a value needs another publisher credential p_i than
    the certificate names, or when the certificate has expired."""

    pp: PublicParams
    keys: Sequence[PublisherKey]
    window: StreamWindow
    #: The end of the keys' epoch (Unix seconds): every certificate expires then, and the
    #: stream publishes nothing after it.
    expires_at: int
    clock: Callable[[], float] = time.time
    session: Session | None = None
    header: _Header | None = None
    spare: _Spare | None = None

    def begin(self, session: Session) -> Session:
        """Run ``session`` from now on; nothing of the previous one is reused."""
        self.session = session
        self.header = self.spare = None
        return session

    def reusable(self, paths: tuple[tuple[Credential, ...], ...], now: float
                 ) -> _Header | None:
        """The last header if every attribute's path is unchanged and its window is open."""
        header, w = self.header, self.window
        if (header is None or header.paths != paths or now - header.opened_at >= w.seconds
                or (w.max_events is not None and header.uses >= w.max_events)):
            return None
        return header


def prepare_next_header(stream: Stream) -> bool:
    """One step (one position: two exponentiations, about half a millisecond) of a fresh
    header for the current header's paths, which the event that finds the window closed
    takes instead of drawing one (:func:`stream_encrypt_and_sign`): the renewal then costs
    that event nothing, where it cost it tens of milliseconds and the events behind it as
    long. A publisher calls it between events. Starts only once the current header has
    lived half its window (a feed whose cells change sooner would waste the work); the
    spare's b_i are its own, so it is a fresh header as any other. Returns whether another
    step would do work."""
    header, session, w = stream.header, stream.session, stream.window
    if header is None or session is None:
        return False
    half_used = (stream.clock() - header.opened_at >= w.seconds / 2
                 or (w.max_events is not None and 2 * header.uses >= w.max_events))
    epoch, mask_id = session.certificate.epoch, entry_mask_id(session.certificate_hash)
    spare = stream.spare
    if spare is None or not spare.serves(header.paths, epoch, mask_id):
        if not half_used:
            return False
        spare = stream.spare = _Spare(header.paths, epoch, mask_id, encrypt_entries_steps(
            stream.pp, epoch, mask_id, header.paths))
    if spare.entries is not None:
        return False
    try:
        next(spare.steps)
    except StopIteration as done:
        spare.entries = done.value[1:]
        return False
    return True


def _take_spare(stream: Stream, epoch: int, mask_id: str,
                paths: tuple[tuple[Credential, ...], ...]
                ) -> tuple[tuple[AttributeCiphertext, ...], Element, Element] | None:
    """The prepared header if it is done and made for these paths, epoch and session; it is
    used once."""
    spare, stream.spare = stream.spare, None
    if spare is None or spare.entries is None or not spare.serves(paths, epoch, mask_id):
        return None
    return spare.entries


def start_session(stream: Stream, keys: Sequence[PublisherKey]) -> Session:
    """A fresh Ed25519 pair (sk, vk), certified by :func:`issue_session_certificate` for
    the publisher keys ``keys`` until the end of their epoch."""
    sk = Ed25519PrivateKey.generate()
    vk = sk.public_key().public_bytes_raw()
    return stream.begin(Session.of(sk, issue_session_certificate(stream.pp, keys, vk,
                                                                 stream.expires_at)))


def stream_encrypt_and_sign(stream: Stream, event: Event) -> StreamEvent:
    """Whole-header reuse (version 2.2): while every attribute's credential path is unchanged
    and the window is open, reuse every entry (C1_i, E_i, R_i) with C0 and Y^s; else draw a
    fresh b_i for every attribute (:func:`credentials.scheme.encrypt_entries`: C0 = hd^s,
    s = sum b_i). K = KDF(Y^s, "payload" || id) seals the payload under the header (with vk
    and the certificate's hash); Ed25519 under sk over the digest of header, C0, every C1_i,
    E_ij, R_ij and the sealed payload."""
    pp, group = stream.pp, stream.pp.group
    epoch, paths, chosen = plan_publication(pp, stream.keys, event)
    now = stream.clock()
    if now >= stream.expires_at:
        raise NotAuthorized(f"the keys' epoch {epoch} ended at {stream.expires_at}: a stream "
                            "publishes with the keys of a running epoch")
    session = stream.session
    if (session is None or now >= session.certificate.expires_at
            or session.certificate.publisher_credentials != tuple(k.credential for k in chosen)):
        session = start_session(stream, chosen)
    header = stream.reusable(tuple(paths), now)
    if header is None:
        mask_id = entry_mask_id(session.certificate_hash)
        entries = (_take_spare(stream, epoch, mask_id, tuple(paths))
                   or encrypt_entries(pp, epoch, mask_id, paths)[1:])
        header = stream.header = _Header(tuple(paths), *entries, now)
    else:
        header.uses += 1
    event_header = EventHeader(schema_id=pp.schema.id, epoch=epoch, event_id=event.event_id,
                               publisher_credentials=session.certificate.publisher_credentials)
    header_bytes = encode_stream_header(event_header, session.vk, session.certificate_hash)
    sealed = seal(payload_key(header.Ys, event.event_id), payload(event), header_bytes,
                  group.random_bytes(NONCE_BYTES))
    digest = signed_digest(header_bytes, header.C0, header.attributes, (), sealed)
    return StreamEvent(header=event_header, vk=session.vk,
                       certificate_hash=session.certificate_hash,
                       certificate=session.encoded, C0=header.C0, attributes=header.attributes,
                       sealed=sealed, signature=session.signing_key.sign(digest))


# -- Routers and subscribers: caches, verification, decryption ------------------------------------

@dataclass
class _Certified:
    certificate: SessionCertificate
    vk: Ed25519PublicKey


@dataclass
class EpochCaches:
    """One epoch's caches of a peer, each a bounded LRU."""

    size: int
    #: Verified certificates by their hash.
    certificates: LRU[bytes, _Certified] = field(init=False)
    #: e(T, C1_i) by (T, C1_i): a router's route tests, a subscriber's unmasking.
    position_keys: PositionKeys = field(init=False)
    #: (credential key matched, C2 unmasked) by (D and the certificate's hash, C1_i), for an
    #: entry seen once: an entry is bound to its session.
    unmasked: LRU[tuple[bytes, bytes],
                  tuple[SubscriberCredentialKey, Element]] = field(init=False)
    #: (credential matched, e(C2, S2) / e(S1, C1_i)) by (D and the certificate's hash, C1_i),
    #: for an entry seen twice.
    factors: LRU[tuple[bytes, bytes], tuple[Credential, Element]] = field(init=False)
    #: (every C1_i, credentials matched, Y^s) by (D and the certificate's hash, C0).
    ys: LRU[tuple[bytes, bytes],
            tuple[tuple[bytes, ...], tuple[Credential, ...], Element]] = field(init=False)
    #: Signed digest and signature pairs that verified: an altered signature is checked
    #: anew, so a frame cannot be changed in transit and still pass.
    verified: LRU[bytes, bool] = field(init=False)
    #: (D, vk, event id) of every event decrypted: a repeat is dropped.
    seen: LRU[tuple[bytes, bytes, str], bool] = field(init=False)

    def __post_init__(self) -> None:
        self.certificates, self.position_keys = LRU(self.size), LRU(self.size)
        self.unmasked, self.factors, self.ys = LRU(self.size), LRU(self.size), LRU(self.size)
        self.verified, self.seen = LRU(self.size), LRU(self.size)


class StreamCaches:
    """A peer's stream caches, per epoch. An epoch gets caches only when something genuine
    vouches for it (:meth:`admit`: a certificate that verified, or this peer's own keys),
    never for what an unchecked event names, so forged headers can neither create cache
    sets nor push out the live ones. Dropping an epoch (its keys expired or were revoked)
    drops its caches and refuses its events, and those of every earlier epoch, from then on.
    Where the peer knows when an epoch ends (:meth:`end_epoch_at`), a certificate of that
    epoch that would outlive it is refused."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._epochs: dict[int, EpochCaches] = {}
        self._ends: dict[int, float] = {}
        self.closed_through = -1

    def epoch(self, epoch: int) -> EpochCaches | None:
        """The caches of ``epoch`` if it was admitted and not dropped, else None."""
        return self._epochs.get(epoch)

    def closed(self, epoch: int) -> bool:
        """Whether ``epoch`` was dropped (or lies below one that was)."""
        return epoch <= self.closed_through

    def admit(self, epoch: int) -> EpochCaches | None:
        """The caches of ``epoch``, created if need be: call it only for an epoch a verified
        certificate or this peer's own keys vouch for. None if the epoch was dropped, or if
        :data:`MAX_EPOCHS` later epochs are kept (the lowest kept makes room for a later
        newcomer only, so the live epochs keep their caches)."""
        if self.closed(epoch):
            return None
        caches = self._epochs.get(epoch)
        if caches is None:
            if len(self._epochs) >= MAX_EPOCHS:
                lowest = min(self._epochs)
                if epoch < lowest:
                    return None
                del self._epochs[lowest]
            caches = self._epochs[epoch] = EpochCaches(self.size)
        return caches

    def end_epoch_at(self, epoch: int, end: float) -> None:
        """``epoch`` ends at ``end`` (Unix seconds, as the key server said when it issued
        this peer's keys): its certificates must expire by then."""
        if not self.closed(epoch):
            self._ends[epoch] = end

    def ends(self, epoch: int) -> float:
        """When ``epoch`` ends, if this peer knows; else infinity."""
        return self._ends.get(epoch, float("inf"))

    def drop_epoch(self, epoch: int) -> None:
        self.closed_through = max(self.closed_through, epoch)
        for old in [e for e in self._epochs if e <= epoch]:
            del self._epochs[old]
        for old in [e for e in self._ends if e <= epoch]:
            del self._ends[old]


def stream_header_bytes(event: StreamEvent) -> bytes:
    return encode_stream_header(event.header, event.vk, event.certificate_hash)


def stream_digest(event: StreamEvent, header_bytes: bytes) -> bytes:
    """SHA-256(header with vk and the certificate's hash || C0 || every C1_i, E_ij, R_ij ||
    sealed payload): what the session key signs (``header_bytes``: the header encoded)."""
    return signed_digest(header_bytes, event.C0, event.attributes, (), event.sealed)


def _binds(certificate: SessionCertificate, event: StreamEvent, now: float, ends: float
           ) -> bool:
    """The certificate names the event's vk, epoch, schema and publisher credentials, has
    not expired at ``now`` and expires by the end of its epoch (``ends``)."""
    c, header = certificate, event.header
    return (c.vk == event.vk and c.epoch == header.epoch and c.schema_id == header.schema_id
            and c.publisher_credentials == header.publisher_credentials
            and now <= c.expires_at <= ends)


def _certified(pp: PublicParams, caches: StreamCaches, event: StreamEvent, now: float
               ) -> _Certified | None:
    """The event's certificate, bound to it (:func:`_binds`): the copy it carries must match
    the hash in its signed header; then from the epoch's cache by hash, else the copy,
    parsed, bound and verified by :func:`verify_session_certificate`; only then is the
    epoch admitted and the certificate remembered (check first, then cache)."""
    if hashlib.sha256(event.certificate).digest() != event.certificate_hash:
        return None  # also when known by hash: every byte of a verified event is bound
    epoch = event.header.epoch
    epoch_caches = caches.epoch(epoch)
    known = None if epoch_caches is None else epoch_caches.certificates.get(
        event.certificate_hash)
    if known is None:
        try:
            certificate = decode_certificate(pp.group, event.certificate)
            vk = Ed25519PublicKey.from_public_bytes(certificate.vk)
        except ValueError:  # CodecError, or not an Ed25519 key
            return None
        if (not _binds(certificate, event, now, caches.ends(epoch))
                or not verify_session_certificate(pp, certificate)):
            return None
        known = _Certified(certificate, vk)
        epoch_caches = caches.admit(epoch)
        if epoch_caches is not None:
            epoch_caches.certificates.remember(event.certificate_hash, known)
    return known if _binds(known.certificate, event, now, caches.ends(epoch)) else None


def stream_verify(pp: PublicParams, caches: StreamCaches, event: StreamEvent, now: float
                  ) -> bool:
    """The epoch was not dropped; the certificate verifies (once; then by hash) and binds
    the event (:func:`_binds`); the Ed25519 signature under vk verifies over
    :func:`stream_digest`."""
    return _verify(pp, caches, event, now, stream_header_bytes(event))


def _verify(pp: PublicParams, caches: StreamCaches, event: StreamEvent, now: float,
            header_bytes: bytes) -> bool:
    if caches.closed(event.header.epoch):
        return False
    try:
        check_structure(pp, event)
    except SchemeError:
        return False
    known = _certified(pp, caches, event, now)
    if known is None:
        return False
    digest = stream_digest(event, header_bytes)
    epoch_caches = caches.epoch(event.header.epoch)
    if epoch_caches is not None and digest + event.signature in epoch_caches.verified:
        return True
    try:
        known.vk.verify(event.signature, digest)
    except InvalidSignature:
        return False
    if epoch_caches is not None:
        epoch_caches.verified.remember(digest + event.signature, True)
    return True


def stream_decrypt(pp: PublicParams, key: SubscriberKey, caches: StreamCaches,
                   event: StreamEvent, now: float) -> Event:
    """After :func:`stream_verify` (so that only the publisher's entries are cached):
    Y^s = e(D, C0) * prod_i e(C2_{i,j_i}, S2_i) / e(S1_i, C1_i), cached by C0, each factor
    cached by C1_i (:func:`_combine`); K = KDF(Y^s, "payload" || id); the AEAD; the values
    against the credentials. A (vk, event id) seen before is refused."""
    header = event.header
    if header.epoch != key.epoch:
        raise DecryptionError(f"event of epoch {header.epoch}, keys of epoch {key.epoch}")
    header_bytes = stream_header_bytes(event)
    if not _verify(pp, caches, event, now, header_bytes):
        raise DecryptionError("stream event fails its certificate or its signature")
    epoch_caches = caches.admit(key.epoch)  # the subscriber's own keys vouch for it
    if epoch_caches is None:
        raise DecryptionError(f"no stream caches for epoch {key.epoch}: later epochs fill them")
    D, C1s = bytes(key.D), tuple(bytes(a.C1) for a in event.attributes)
    scope = D + event.certificate_hash
    if (D, event.vk, header.event_id) in epoch_caches.seen:
        raise DecryptionError(f"event id {header.event_id!r} of this stream seen before")
    hit = epoch_caches.ys.get((scope, bytes(event.C0)))
    learned = _Learned()
    if hit is not None and hit[0] == C1s:
        matched, Ys = hit[1], hit[2]
    else:
        matched, Ys = _combine(pp, key, epoch_caches, event, learned)
    try:
        sealed = open_sealed(payload_key(Ys, header.event_id), event.sealed, header_bytes)
    except AuthenticationFailed as exc:
        raise DecryptionError("payload does not open: credentials do not match") from exc
    out = parse_payload(pp.schema, header, matched, sealed)
    for C1, unmasked in learned.unmasked.items():
        epoch_caches.unmasked.remember((scope, C1), unmasked)
    for C1, factor in learned.factors.items():
        epoch_caches.factors.remember((scope, C1), factor)
    epoch_caches.ys.remember((scope, bytes(event.C0)), (C1s, matched, Ys))
    epoch_caches.seen.remember((D, event.vk, header.event_id), True)
    return out


@dataclass
class _Learned:
    """What one decryption learnt, cached once its payload opens."""

    unmasked: dict[bytes, tuple[SubscriberCredentialKey, Element]] = field(default_factory=dict)
    factors: dict[bytes, tuple[Credential, Element]] = field(default_factory=dict)


def _combine(pp: PublicParams, key: SubscriberKey, caches: EpochCaches, event: StreamEvent,
             learned: _Learned) -> tuple[tuple[Credential, ...], Element]:
    """Y^s = e(D, C0) * prod_i factor_i, factor_i = e(C2_i, S2_i) / e(S1_i, C1_i), and the
    credentials matched. A factor costs a final exponentiation of its own, worth paying
    only for an entry that recurs: an entry seen for the first time is unmasked and its
    pairs join e(D, C0) in one multi-pairing (its C2 is remembered); seen a second time,
    its factor is computed from the remembered C2 and cached by C1_i; from then on it
    costs nothing."""
    group, scope = pp.group, bytes(key.D) + event.certificate_hash
    pairs: list[tuple[Element, Element | PreparedG2]] = [(key.D, event.C0)]
    matched, factors = [], []
    try:
        for i, (a, ct) in enumerate(zip(pp.schema.attributes, event.attributes, strict=True)):
            C1 = bytes(ct.C1)
            factor = caches.factors.get((scope, C1))
            if factor is None:
                unmasked = caches.unmasked.get((scope, C1))
                if unmasked is None:
                    k, C2 = learned.unmasked[C1] = unmask(pp, key, i, a.name, event,
                                                          entry_mask_id(event.certificate_hash),
                                                          caches.position_keys)
                    pairs += [(C2, k.S2_prepared or k.S2), (~k.S1, ct.C1)]
                    matched.append(k.credential)
                    continue
                k, C2 = unmasked
                factor = learned.factors[C1] = (k.credential, group.multi_pair(
                    [(C2, k.S2_prepared or k.S2), (~k.S1, ct.C1)]))
            matched.append(factor[0])
            factors.append(factor[1])
        Ys = group.multi_pair(pairs)
    except GroupError as exc:
        raise DecryptionError(f"malformed event: {exc}") from exc
    for f in factors:
        Ys = Ys * f
    return tuple(matched), Ys
