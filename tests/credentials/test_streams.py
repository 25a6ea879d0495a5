"""Streams (docs/scheme.md, version 2.2) on the native backend: reuse, certificates, caches,
and every refusal, each with its control."""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_scheme import EPOCH, world
from test_scheme import subscriber as scheme_subscriber

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import streams as T
from ibe_pubsub.credentials.server_keys import Ed25519Server
from ibe_pubsub.credentials.symmetric import NONCE_BYTES, seal
from ibe_pubsub.overlay.crypto import CryptoRejected
from ibe_pubsub.overlay.crypto_real import RealCrypto

__all__ = ["world"]  # the fixture (group, master secret, a publisher of everything)
#: Two values per attribute, in different cells, both inside SUBSCRIPTION.
VALUES = {"symbol": ("IBM", "IBX"), "price": (42.0, 47.0), "qty": (3, 6)}
SUBSCRIPTION = 'symbol prefix "IB" and price in [40, 50] and qty <= 7'


def subscriber(pp, msk, text=SUBSCRIPTION):
    return scheme_subscriber(pp, msk, text)


def stream(world, seconds=60.0, max_events=None, expires_in=3600, clock=time.time):
    pp, _, publisher = world
    return T.Stream(pp, publisher, T.StreamWindow(seconds, max_events),
                    int(time.time()) + expires_in, clock)


def event(n, choice=(0, 0, 0)):
    return S.Event(f"e-{n}", {a: VALUES[a][k] for a, k in zip(VALUES, choice, strict=True)},
                   b"body")


def wire(group, ev):
    """Through the encoding, as a peer receives it."""
    return codec.decode_any_event(group, codec.encode_stream_event(ev))


def test_every_mix_of_reused_and_fresh_entries_decrypts(world):
    pp, msk, _ = world
    key, late = subscriber(pp, msk), subscriber(pp, msk)
    other = subscriber(pp, msk, 'symbol = "MSFT"')
    s, caches = stream(world), T.StreamCaches()
    choice, previous = (0, 0, 0), T.stream_encrypt_and_sign(s, event(0))
    T.stream_decrypt(pp, key, caches, wire(pp.group, previous), time.time())
    for n, moved in enumerate(itertools.product((False, True), repeat=3), start=1):
        choice = tuple(1 - c if m else c for c, m in zip(choice, moved, strict=True))
        ct = T.stream_encrypt_and_sign(s, event(n, choice))
        reused = [a.C1 == b.C1 for a, b in zip(ct.attributes, previous.attributes, strict=True)]
        assert reused == [not any(moved)] * 3  # the whole header, or none of it (v2.2)
        assert (ct.C0 == previous.C0) == (not any(moved))
        got = T.stream_decrypt(pp, key, caches, wire(pp.group, ct), time.time())
        assert got == event(n, choice)
        # a subscriber that joins now has no cache: the entries made earlier still open
        assert T.stream_decrypt(pp, late, T.StreamCaches(), wire(pp.group, ct),
                                time.time()) == event(n, choice)
        with pytest.raises(S.DecryptionError):
            T.stream_decrypt(pp, other, T.StreamCaches(), wire(pp.group, ct), time.time())
        previous = ct


def test_window_closes_by_count_and_by_duration(world):
    now = [1000.0]
    s = stream(world, seconds=5.0, max_events=2, clock=lambda: now[0])
    c1 = [T.stream_encrypt_and_sign(s, event(n)).attributes[0].C1 for n in range(3)]
    assert c1[0] == c1[1] != c1[2]  # the third event is past max_events
    now[0] += 4.9
    assert c1[2] == T.stream_encrypt_and_sign(s, event(3)).attributes[0].C1
    now[0] += 0.2
    assert c1[2] != T.stream_encrypt_and_sign(s, event(4)).attributes[0].C1


def _exponentiations(group):
    return sum(n for op, n in group.counts.items() if op.startswith("exp_"))


def _prepare_all(s):
    steps = 0
    while T.prepare_next_header(s):
        steps += 1
    return steps


def test_a_prepared_header_renews_the_window_at_no_cost_to_the_event(world):
    pp, msk, _ = world
    now = [1000.0]
    s = stream(world, seconds=2.0, clock=lambda: now[0])
    first = T.stream_encrypt_and_sign(s, event(0))
    now[0] += 0.9
    assert not T.prepare_next_header(s) and s.spare is None  # under half the window
    now[0] += 0.2
    positions = sum(len(p) for p in s.header.paths)
    assert _prepare_all(s) == positions  # a step a position
    spare_c0 = s.spare.entries[1]
    assert not T.prepare_next_header(s)  # ready: nothing more to do
    now[0] += 1.0  # the window closed
    before = _exponentiations(pp.group)
    renewed = T.stream_encrypt_and_sign(s, event(1))
    # only the per-event work: no exponentiation (a fresh header costs two a position)
    assert _exponentiations(pp.group) == before
    assert renewed.C0 == spare_c0 != first.C0 and s.spare is None
    assert all(a.C1 != b.C1 for a, b in zip(renewed.attributes, first.attributes, strict=True))
    key, other = subscriber(pp, msk), subscriber(pp, msk, 'symbol = "MSFT"')
    caches = T.StreamCaches()
    assert T.stream_decrypt(pp, key, caches, wire(pp.group, first), now[0]) == event(0)
    assert T.stream_decrypt(pp, key, caches, wire(pp.group, renewed), now[0]) == event(1)
    with pytest.raises(S.DecryptionError):
        T.stream_decrypt(pp, other, T.StreamCaches(), wire(pp.group, renewed), now[0])
    # control: without a prepared header the renewal pays two exponentiations a position
    now[0] += 2.1
    before = _exponentiations(pp.group)
    T.stream_encrypt_and_sign(s, event(2))
    assert _exponentiations(pp.group) - before >= 2 * positions


@pytest.mark.parametrize("change", ["paths", "session", "window open"])
def test_a_prepared_header_serves_only_its_paths_and_session(world, change):
    now = [1000.0]
    s = stream(world, seconds=2.0, clock=lambda: now[0])
    T.stream_encrypt_and_sign(s, event(0))
    now[0] += 1.1
    _prepare_all(s)
    spare_c0 = s.spare.entries[1]
    if change == "paths":  # another cell: the spare was made for the old one
        now[0] += 1.0
        ct = T.stream_encrypt_and_sign(s, event(1, (1, 0, 0)))
    elif change == "session":  # a new certificate binds other masks
        T.start_session(s, S.plan_publication(s.pp, s.keys, event(1))[2])
        now[0] += 1.0
        ct = T.stream_encrypt_and_sign(s, event(1))
    else:  # the current header is reused while its window is open
        ct = T.stream_encrypt_and_sign(s, event(1))
        assert s.spare is not None and s.spare.entries[1] == spare_c0
        now[0] += 1.0
        ct = T.stream_encrypt_and_sign(s, event(2))
        assert spare_c0 == ct.C0  # control: the same spare serves once the window closes
        return
    assert spare_c0 != ct.C0 and s.spare is None


def test_two_prepared_headers_share_no_randomness(world):
    now = [1000.0]
    s = stream(world, seconds=2.0, clock=lambda: now[0])
    C0s = [T.stream_encrypt_and_sign(s, event(0)).C0]
    for n in range(1, 4):
        now[0] += 1.1
        _prepare_all(s)
        now[0] += 1.0
        C0s.append(T.stream_encrypt_and_sign(s, event(n)).C0)
    assert len({bytes(c) for c in C0s}) == 4


def _with_session(world, signing_key, certificate):
    """A stream whose session is ``certificate`` under ``signing_key``."""
    s = stream(world)
    s.begin(T.Session.of(signing_key, certificate))
    return s


def test_forged_certificate_refused(world):
    pp, msk, publisher = world
    key, genuine = subscriber(pp, msk), stream(world)
    T.stream_encrypt_and_sign(genuine, event(0))
    thief = Ed25519PrivateKey.generate()
    vk = thief.public_key().public_bytes_raw()
    # the genuine publisher's certificate parts, claimed for the thief's key
    forged = dataclasses.replace(genuine.session.certificate, vk=vk)
    ct = T.stream_encrypt_and_sign(_with_session(world, thief, forged), event(1))
    assert not T.verify_session_certificate(pp, forged)
    assert not T.stream_verify(pp, T.StreamCaches(), wire(pp.group, ct), time.time())
    with pytest.raises(S.DecryptionError):
        T.stream_decrypt(pp, key, T.StreamCaches(), wire(pp.group, ct), time.time())
    # control: the same construction with a certificate the publisher keys issued for vk
    keys = [S.publisher_key_for(publisher, c) for c in forged.publisher_credentials]
    issued = T.issue_session_certificate(pp, keys, vk, forged.expires_at)
    ct = T.stream_encrypt_and_sign(_with_session(world, thief, issued), event(1))
    assert T.stream_decrypt(pp, key, T.StreamCaches(), wire(pp.group, ct),
                            time.time()) == event(1)


def test_expired_certificate_and_dropped_epoch_refused(world):
    pp, msk, _ = world
    key, s = subscriber(pp, msk), stream(world, expires_in=100)
    ct = wire(pp.group, T.stream_encrypt_and_sign(s, event(0)))
    expiry = s.session.certificate.expires_at
    assert not T.stream_verify(pp, T.StreamCaches(), ct, expiry + 1)
    assert T.stream_verify(pp, T.StreamCaches(), ct, expiry)  # control
    caches = T.StreamCaches()
    assert T.stream_decrypt(pp, key, caches, ct, time.time()) == event(0)  # control
    caches.drop_epoch(EPOCH)
    assert not T.stream_verify(pp, caches, ct, time.time())
    assert caches.admit(EPOCH) is None and caches.admit(EPOCH + 1) is not None


def test_event_signed_by_another_streams_key_refused(world):
    pp = world[0]
    a, b = stream(world), stream(world)
    ct = T.stream_encrypt_and_sign(a, event(0))
    T.stream_encrypt_and_sign(b, event(0))
    digest = T.stream_digest(ct, T.stream_header_bytes(ct))
    other = dataclasses.replace(ct, signature=b.session.signing_key.sign(digest))
    assert not T.stream_verify(pp, T.StreamCaches(), wire(pp.group, other), time.time())
    own = dataclasses.replace(ct, signature=a.session.signing_key.sign(digest))
    assert T.stream_verify(pp, T.StreamCaches(), wire(pp.group, own), time.time())  # control


def test_replayed_event_id_dropped(world):
    pp, msk, _ = world
    key, s, caches = subscriber(pp, msk), stream(world), T.StreamCaches()
    first, second = T.stream_encrypt_and_sign(s, event(0)), T.stream_encrypt_and_sign(s, event(1))
    again = T.stream_encrypt_and_sign(s, event(0, (1, 1, 1)))  # a new event, an old id
    for ct in (first, second):  # control: distinct ids are delivered
        T.stream_decrypt(pp, key, caches, wire(pp.group, ct), time.time())
    for ct in (first, again):
        with pytest.raises(S.DecryptionError, match="seen before"):
            T.stream_decrypt(pp, key, caches, wire(pp.group, ct), time.time())
    # another subscriber sharing the caches (one crypto suite, several keys) is not fooled
    assert T.stream_decrypt(pp, subscriber(pp, msk), caches, wire(pp.group, first),
                            time.time()) == event(0)


def test_tampered_reused_entry_refused(world):
    pp, msk, _ = world
    key, s, caches = subscriber(pp, msk), stream(world), T.StreamCaches()
    T.stream_decrypt(pp, key, caches, wire(pp.group, T.stream_encrypt_and_sign(s, event(0))),
                     time.time())
    ct = T.stream_encrypt_and_sign(s, event(1))  # every entry reused, caches warm
    entry = ct.attributes[1]
    bad = dataclasses.replace(entry, R=(entry.R[1], *entry.R[1:]))
    tampered = dataclasses.replace(ct, attributes=(ct.attributes[0], bad, ct.attributes[2]))
    assert not T.stream_verify(pp, caches, wire(pp.group, tampered), time.time())
    with pytest.raises(S.DecryptionError):
        T.stream_decrypt(pp, key, caches, wire(pp.group, tampered), time.time())
    assert T.stream_decrypt(pp, key, caches, wire(pp.group, ct), time.time()) == event(1)


def test_caches_stay_bounded_under_a_flood_of_distinct_C1(world):
    pp, msk, _ = world
    key, s, caches = subscriber(pp, msk), stream(world, max_events=2), T.StreamCaches(size=4)
    caches.admit(EPOCH)  # as a peer holding keys of the epoch does
    token = key.for_attribute("symbol")[0].token.blinded()
    for n in range(12):  # qty moves every event, the other entries live for two
        ct = wire(pp.group, T.stream_encrypt_and_sign(s, event(n, (0, 0, n % 2))))
        assert S.route_test(pp, token, ct, caches.epoch(EPOCH).position_keys)
        T.stream_decrypt(pp, key, caches, ct, time.time())
    c = caches.epoch(EPOCH)
    sizes = [len(x) for x in (c.position_keys, c.unmasked, c.ys, c.verified, c.seen)]
    assert sizes == [4] * 5  # full (the flood reached them), and no fuller
    # an entry recurs only with its whole header (v2.2), so Y^s by C0 serves it and no
    # factor is needed: factors serve streams of version 2.1 publishers
    assert len(c.factors) == 0


def test_real_crypto_takes_both_modes(world):
    pp, msk, publisher = world
    key = subscriber(pp, msk)
    crypto = RealCrypto(pp, any_server())
    symbol = key.for_attribute("symbol")[0].token.blinded()
    token = crypto.decode_token(codec.encode_blinded_token(symbol))
    v2 = codec.encode_event(S.encrypt_and_sign(pp, publisher, event(0)))
    stream_event = codec.encode_stream_event(T.stream_encrypt_and_sign(stream(world), event(1)))
    for n, data in enumerate((v2, stream_event)):
        ct = crypto.decode_event(data)
        assert crypto.route(token, ct) and crypto.verify(ct)
        assert crypto.decrypt(key, ct) == event(n)
    crypto.drop_epoch(EPOCH)  # a dropped epoch refuses the stream's events
    assert not crypto.verify(crypto.decode_event(stream_event))


def any_server() -> Ed25519Server:
    return Ed25519Server(Ed25519PrivateKey.generate().public_key().public_bytes_raw())


@pytest.mark.parametrize("kind", ["version 2", "stream"])
@pytest.mark.parametrize("cut", ["an attribute", "a position"])
def test_events_of_another_shape_refused_at_decoding(world, kind, cut):
    """An event that decodes but lacks an attribute or a position of the schema is refused
    before anything indexes into it (listing it for watchers raised IndexError)."""
    pp, _, publisher = world
    crypto = RealCrypto(pp, any_server())
    ct = (S.encrypt_and_sign(pp, publisher, event(0)) if kind == "version 2"
          else T.stream_encrypt_and_sign(stream(world), event(0)))
    encode = codec.encode_event if kind == "version 2" else codec.encode_stream_event
    assert crypto.digest_entry(crypto.decode_event(encode(ct)), "qty", 1)  # control
    if cut == "an attribute":
        short = dataclasses.replace(ct, attributes=ct.attributes[:1], header=dataclasses.replace(
            ct.header, publisher_credentials=ct.header.publisher_credentials[:1]))
        if kind == "version 2":
            short = dataclasses.replace(short, signatures=ct.signatures[:1])
    else:
        last = ct.attributes[2]
        cut_entry = dataclasses.replace(last, E=last.E[:-1], R=last.R[:-1])
        short = dataclasses.replace(ct, attributes=(*ct.attributes[:2], cut_entry))
    assert codec.decode_any_event(pp.group, encode(short))  # the bytes themselves decode
    with pytest.raises(CryptoRejected):
        crypto.decode_event(encode(short))


@pytest.mark.parametrize("damage", ["truncate", "extend", "inner tag"])
def test_malformed_stream_events_fail_decoding(world, damage):
    pp, _, _ = world
    data = codec.encode_stream_event(T.stream_encrypt_and_sign(stream(world), event(0)))
    assert codec.decode_any_event(pp.group, data)  # control
    bad = {"truncate": data[:-1], "extend": data + b"\0",
           "inner tag": data[:6] + bytes((codec.TAG_HEADER,)) + data[7:]}[damage]
    with pytest.raises(codec.CodecError):
        codec.decode_any_event(pp.group, bad)


def test_altered_signature_refused_after_the_digest_verified(world):
    pp = world[0]
    caches, ct = T.StreamCaches(), T.stream_encrypt_and_sign(stream(world), event(0))
    assert T.stream_verify(pp, caches, wire(pp.group, ct), time.time())  # control, warm cache
    flipped = bytes([ct.signature[0] ^ 1]) + ct.signature[1:]
    altered = dataclasses.replace(ct, signature=flipped)
    assert not T.stream_verify(pp, caches, wire(pp.group, altered), time.time())


def _rewrapped(pp, source, Ys, session, n):
    """``source``'s C0 and entries under ``session``'s certificate, with a payload of the
    holder's choice sealed under the Y^s it learnt by decrypting ``source``."""
    header = dataclasses.replace(source.header, event_id=f"e-{n}")
    header_bytes = codec.encode_stream_header(header, session.vk, session.certificate_hash)
    sealed = seal(S.payload_key(Ys, header.event_id), S.payload(event(n)), header_bytes,
                  pp.group.random_bytes(NONCE_BYTES))
    digest = S.signed_digest(header_bytes, source.C0, source.attributes, (), sealed)
    return dataclasses.replace(source, header=header, vk=session.vk,
                               certificate_hash=session.certificate_hash,
                               certificate=session.encoded, sealed=sealed,
                               signature=session.signing_key.sign(digest))


def test_entries_rewrapped_under_another_session_refused(world):
    """A publisher that can read another's stream knows its Y^s; its own certificate must
    not carry the other session's entries, even where the subscriber's caches know them."""
    pp, msk, _ = world
    key, caches = subscriber(pp, msk), T.StreamCaches()
    caches.admit(EPOCH)
    victim, holder = stream(world), stream(world)
    source = T.stream_encrypt_and_sign(victim, event(0))
    T.stream_encrypt_and_sign(holder, event(0))
    for _ in range(2):  # warm every cache: an entry's factor is cached from its 2nd sighting
        T.stream_decrypt(pp, key, caches, wire(pp.group, T.stream_encrypt_and_sign(
            victim, event(len(caches.epoch(EPOCH).seen) + 1))), time.time())
    Ys = victim.header.Ys
    own = _rewrapped(pp, source, Ys, victim.session, 10)  # control: its own session passes
    assert T.stream_decrypt(pp, key, caches, wire(pp.group, own), time.time()) == event(10)
    forged = _rewrapped(pp, source, Ys, holder.session, 11)
    assert T.stream_verify(pp, caches, wire(pp.group, forged), time.time())  # signed by holder
    with pytest.raises(S.DecryptionError):
        T.stream_decrypt(pp, key, caches, wire(pp.group, forged), time.time())


def _naming_epoch(ct, epoch):
    """``ct`` with its header (and so its signed digest) claiming ``epoch``: what a forger
    without that epoch's keys can send."""
    return dataclasses.replace(ct, header=dataclasses.replace(ct.header, epoch=epoch))


@pytest.mark.parametrize("claimed", ["old", "far"])
def test_forged_events_of_other_epochs_cannot_evict_the_live_caches(world, claimed):
    """Forged stream events naming old (or far) epochs get no caches of their own, so they
    cannot push out the current epoch's: its genuine events still verify and decrypt."""
    pp, msk, _ = world
    key, caches, s = subscriber(pp, msk), T.StreamCaches(size=4), stream(world)
    assert T.stream_decrypt(pp, key, caches, wire(pp.group, T.stream_encrypt_and_sign(
        s, event(0))), time.time()) == event(0)  # control: the live epoch has caches
    live = caches.epoch(EPOCH)
    for n in range(2 * T.MAX_EPOCHS):
        epoch = EPOCH - 1 - n % EPOCH if claimed == "old" else EPOCH + 10 + n
        forged = _naming_epoch(T.stream_encrypt_and_sign(s, event(100 + n)), epoch)
        assert not T.stream_verify(pp, caches, wire(pp.group, forged), time.time())
    assert caches.epoch(EPOCH) is live and list(caches._epochs) == [EPOCH]
    assert T.stream_decrypt(pp, key, caches, wire(pp.group, T.stream_encrypt_and_sign(
        s, event(1))), time.time()) == event(1)


def test_the_live_epoch_keeps_its_caches_when_later_epochs_come():
    caches = T.StreamCaches(size=4)
    live = caches.admit(EPOCH)
    for later in range(EPOCH + 1, EPOCH + T.MAX_EPOCHS):
        assert caches.admit(later) is not None
    assert caches.admit(EPOCH - 1) is None  # full: an older newcomer gets none
    assert caches.epoch(EPOCH) is live
    assert caches.admit(EPOCH + T.MAX_EPOCHS) is not None  # a later one pushes out the oldest
    assert caches.epoch(EPOCH) is None


def test_certificate_outliving_its_epoch_refused(world):
    """A peer that knows when the epoch ends refuses a certificate that expires later."""
    pp = world[0]
    ct = wire(pp.group, T.stream_encrypt_and_sign(stream(world, expires_in=100), event(0)))
    expiry = codec.decode_certificate(pp.group, ct.certificate).expires_at
    knows_earlier_end, knows_end = T.StreamCaches(), T.StreamCaches()
    knows_earlier_end.end_epoch_at(EPOCH, expiry - 1)
    knows_end.end_epoch_at(EPOCH, expiry)
    assert not T.stream_verify(pp, knows_earlier_end, ct, time.time())
    assert T.stream_verify(pp, knows_end, ct, time.time())  # control


def test_stream_publishes_nothing_after_its_epoch_ended(world):
    now = [time.time()]
    s = stream(world, expires_in=10, clock=lambda: now[0])
    T.stream_encrypt_and_sign(s, event(0))  # control: within the epoch
    now[0] += 11
    with pytest.raises(S.NotAuthorized, match="ended"):
        T.stream_encrypt_and_sign(s, event(1))
