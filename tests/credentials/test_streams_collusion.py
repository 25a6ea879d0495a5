"""Collusion across the events of a stream (docs/scheme.md, 15.2): two subscribers pool
what they hold to read an event neither matches alone.

Under per-attribute reuse (version 2.1, withdrawn) two events of a stream that differ in
one attribute ``p`` share every other ``b_i``, so ``C0' / C0 = hd^(b_p' - b_p)``. A
subscriber whose credential matches ``p`` in both events gets ``Y^(b_p' - b_p)`` from its
own ``D`` and its two factors for ``p``; a second subscriber that read the first event
holds ``Y^s``; their product is ``Y^s'``. Whole-header reuse (version 2.2) leaves two
events either with the same ``s`` or with no ``b_i`` in common, so the product is
useless. The attacker below uses public event bytes and the two subscribers' own keys
only, and does everything the algebra allows.
"""

from __future__ import annotations

import time

import pytest
from test_scheme import subscriber as keys_for
from test_scheme import world

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import streams as T
from ibe_pubsub.credentials.symmetric import AuthenticationFailed, open_sealed

__all__ = ["world"]  # the fixture (group, master secret, a publisher of everything)

#: Reads the first event (it matches every attribute of it), not the second.
READER = 'symbol = "IBM" and price in [40, 50]'
#: Matches neither event (another symbol), but its price and qty credentials are the whole
#: domain, so it unmasks those attributes of both events.
HELPER = 'symbol = "AAPL"'
FIRST = {"symbol": "IBM", "price": 42.0, "qty": 3}
SECOND = {"symbol": "IBM", "price": 90.0, "qty": 3}  # another price cell: nobody's event


def factor(pp: S.PublicParams, key: S.SubscriberKey, event: T.StreamEvent, i: int):
    """f_i = e(C2_i, S2_i) / e(S1_i, C1_i) = e(g2, ĝ)^(-gamma_s * b_i), if ``key`` has a
    credential matching attribute i of ``event``; else None."""
    attribute = pp.schema.attributes[i].name
    try:
        k, C2 = S.unmask(pp, key, i, attribute, event, T.entry_mask_id(event.certificate_hash))
    except S.SchemeError:
        return None
    return pp.group.multi_pair([(C2, k.S2), (~k.S1, event.attributes[i].C1)])


def shift(pp: S.PublicParams, key: S.SubscriberKey, old: T.StreamEvent,
          new: T.StreamEvent):
    """Y^(s' - s), as far as ``key`` can get it: e(D, C0' / C0) times, per attribute it
    unmasks in both events, f_i' / f_i; an attribute it cannot unmask is taken as shared."""
    out = pp.group.pair(key.D, new.C0 / old.C0)
    for i in range(len(pp.schema.attributes)):
        f_old, f_new = factor(pp, key, old, i), factor(pp, key, new, i)
        if f_old is not None and f_new is not None:
            out = out * f_new / f_old
    return out


def y_s(pp: S.PublicParams, key: S.SubscriberKey, event: T.StreamEvent):
    """Y^s of an event ``key`` matches: e(D, C0) * prod_i f_i."""
    out = pp.group.pair(key.D, event.C0)
    for i in range(len(pp.schema.attributes)):
        out = out * factor(pp, key, event, i)
    return out


def opens(event: T.StreamEvent, Ys) -> bool:
    """Whether ``Ys`` opens the event's payload (AEAD under KDF(Y^s, id))."""
    try:
        open_sealed(S.payload_key(Ys, event.header.event_id), event.sealed,
                    T.stream_header_bytes(event))
    except AuthenticationFailed:
        return False
    return True


def publish(world, values: list[dict]) -> list[T.StreamEvent]:
    """One stream's events, as a peer receives them (through the encoding)."""
    pp, _, publisher = world
    stream = T.Stream(pp, publisher, T.StreamWindow(60.0), int(time.time()) + 3600)
    return [codec.decode_stream_event(pp.group, codec.encode_stream_event(
        T.stream_encrypt_and_sign(stream, S.Event(f"e-{n}", v, b"secret"))))
        for n, v in enumerate(values)]


def test_two_subscribers_cannot_pool_keys_to_read_a_stream_event_neither_matches(world):
    pp, msk, _ = world
    reader, helper = keys_for(pp, msk, READER), keys_for(pp, msk, HELPER)
    first, second = publish(world, [FIRST, SECOND])
    caches = T.StreamCaches()
    assert T.stream_decrypt(pp, reader, caches, first, time.time()).values == FIRST
    for key in (reader, helper):  # neither reads the second event alone
        with pytest.raises(S.DecryptionError):
            T.stream_decrypt(pp, key, T.StreamCaches(), second, time.time())
    assert T.stream_verify(pp, caches, second, time.time())
    pooled = y_s(pp, reader, first) * shift(pp, helper, first, second)
    assert not opens(second, pooled)


def test_control_the_attack_opens_where_the_pooled_keys_match(world):
    """The same pooling opens the second event when the helper's keys unmask every attribute
    of both events (it may read the second event itself): the harness's algebra is right, so
    the refusal above is the scheme's, not the harness's."""
    pp, msk, _ = world
    reader, helper = keys_for(pp, msk, READER), keys_for(pp, msk, 'symbol = "IBM"')
    first, second = publish(world, [FIRST, SECOND])
    assert opens(first, y_s(pp, reader, first))
    assert opens(second, y_s(pp, reader, first) * shift(pp, helper, first, second))
    assert not opens(second, y_s(pp, reader, first))  # and Y^s alone does not


def test_whole_header_is_reused_or_none_of_it(world):
    """Version 2.2: every entry and C0 reused together while every path is unchanged; one
    moved attribute draws fresh b_i for every attribute."""
    same = publish(world, [FIRST, FIRST])
    assert same[0].C0 == same[1].C0
    assert [a.C1 for a in same[0].attributes] == [a.C1 for a in same[1].attributes]
    moved = publish(world, [FIRST, SECOND])
    assert moved[0].C0 != moved[1].C0
    assert all(a.C1 != b.C1 for a, b in zip(moved[0].attributes, moved[1].attributes,
                                            strict=True))
