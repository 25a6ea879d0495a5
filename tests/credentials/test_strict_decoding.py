"""Strict decoding: every group element has exactly one encoding, the identity of G1/G2 none.

mcl decodes ``c0 00 .. 00 XX`` (XX = 01..ff) as the identity of G1 and G2. An event whose
C0, C1_i and C2 were spelled that way matched every routing token at every position and
decrypted at every subscriber to the sender's payload. Every refusal below comes with a
control: the same harness takes the canonical bytes, so a decoder that let a spelling
through would fail it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_scheme import EPOCH, event, subscriber, world
from test_streams import event as stream_values
from test_streams import stream, wire

from ibe_pubsub.credentials import codec
from ibe_pubsub.credentials import scheme as S
from ibe_pubsub.credentials import streams as T
from ibe_pubsub.credentials.backends import load_group
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.groups import G1, G2, GT, Element, GroupError, GroupKind, PairingGroup
from ibe_pubsub.credentials.messages import (
    AttributeCiphertext,
    AttributeSignature,
    EncryptedEvent,
    EventHeader,
)
from ibe_pubsub.credentials.server_keys import Ed25519Server
from ibe_pubsub.credentials.symmetric import H4, KDF, seal
from ibe_pubsub.credentials.vectors import identity_spelling, rejected_encodings

__all__ = ["world"]  # the fixture (group, master secret, a publisher of everything)
POINTS = (G1, G2)


def refused(group: PairingGroup, kind: GroupKind, data: bytes, reason: str | None = None
            ) -> None:
    """Both ways in refuse ``data``: deserialize at once, an unchecked element when used."""
    with pytest.raises(GroupError, match=reason):
        group.deserialize(kind, data)
    lazy = group.unchecked(kind, data)
    with pytest.raises(GroupError, match=reason):
        lazy * lazy  # the first use parses


def accepted(group: PairingGroup, kind: GroupKind, data: bytes) -> None:
    """The control: both ways in take canonical bytes of a valid element."""
    eager = group.deserialize(kind, data)
    assert bytes(eager) == data
    assert group.unchecked(kind, data) * eager == eager * eager


def valid(group: PairingGroup, kind: GroupKind) -> bytes:
    return bytes(group.generator(kind) ** 12345)


@pytest.mark.parametrize("kind", POINTS)
def test_all_255_non_canonical_spellings_of_the_identity_are_refused(kind: GroupKind) -> None:
    group = load_group("mcl")
    accepted(group, kind, valid(group, kind))
    refused(group, kind, identity_spelling(kind, 0), "identity")
    for value in range(1, 256):
        data = identity_spelling(kind, value)
        # why the check is needed: the backend alone takes each one as the identity
        assert group._op_eq(kind, group._deserialize(kind, data), group.identity(kind).raw)
        refused(group, kind, data, "non-canonical")


@pytest.mark.parametrize("kind", POINTS)
def test_non_zero_padding_anywhere_after_the_infinity_flag_is_refused(kind: GroupKind) -> None:
    group = load_group("mcl")
    accepted(group, kind, valid(group, kind))
    for position in range(1, group.sizes[kind]):
        for value in (0x01, 0x80, 0xFF):
            refused(group, kind, identity_spelling(kind, value, position))


def test_every_listed_rejected_encoding_is_refused_both_ways() -> None:
    """The test vectors' list (G1, G2 and GT: flags, coordinates >= p, off the curve or
    the subgroup); the generators are the controls."""
    group = load_group("mcl")
    listed = rejected_encodings(group)
    for kind in (G1, G2, GT):
        accepted(group, kind, valid(group, kind))
        assert listed[kind.value]
        for entry in listed[kind.value]:
            refused(group, kind, bytes.fromhex(entry["bytes"]))


# -- messages: a spelling planted in the encoded bytes ------------------------------------------

def plant(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with its one occurrence of ``old`` replaced by ``new`` (as long): what
    anyone can do to public bytes."""
    assert len(old) == len(new) and data.count(old) == 1
    return data.replace(old, new)


def planted(data: bytes, element: Element) -> bytes:
    """``data`` with ``element`` spelled as the identity ending in 01."""
    return plant(data, bytes(element), identity_spelling(element.kind, 1))


def test_keys_with_a_planted_identity_fail_decoding(world: Any) -> None:
    pp, msk, publisher = world
    key = subscriber(pp, msk, 'price in [10, 20]')
    credential = key.credentials[0]
    cases: list[tuple[bytes, Callable[[PairingGroup, bytes], Any], Sequence[Element]]] = [
        (codec.encode_mpk(pp.mpk), codec.decode_mpk,
         (pp.mpk.g, pp.mpk.g_hat, pp.mpk.g2, pp.mpk.h, pp.mpk.hd)),
        (codec.encode_publisher_key(publisher[0]), codec.decode_publisher_key,
         (publisher[0].P1, publisher[0].P2)),
        (codec.encode_subscriber_key(key), codec.decode_subscriber_key,
         (key.D, credential.S1, credential.S2, credential.T)),
        (codec.encode_subscriber_credential_key(credential),
         codec.decode_subscriber_credential_key, (credential.S1, credential.S2, credential.T)),
        (codec.encode_routing_token(credential.token), codec.decode_routing_token,
         (credential.token.T,)),
        (codec.encode_blinded_token(credential.token.blinded()), codec.decode_blinded_token,
         (credential.token.blinded().T,)),
    ]
    for data, decode, elements in cases:
        decode(pp.group, data)  # control
        for element in elements:
            with pytest.raises(codec.CodecError, match="non-canonical"):
                decode(pp.group, planted(data, element))


def test_events_with_a_planted_identity_are_refused(world: Any) -> None:
    """C0, C1_i, Sig_i and P2_i: the element refuses its first use, verify the event, and
    the route test and decryption the event when they read the element."""
    pp, msk, publisher = world
    key = subscriber(pp, msk, "")
    token = key.credentials[0].token
    ct = S.encrypt_and_sign(pp, publisher, event())
    data = codec.encode_event(ct)
    honest = codec.decode_event(pp.group, data)
    assert S.route_test(pp, token, honest) and S.verify(pp, honest)  # control
    assert S.decrypt(pp, key, honest) == event()
    parts: list[tuple[Callable[[EncryptedEvent], Element], bool, bool]] = [
        # (the element, read by the route test, read by decryption)
        (lambda e: e.C0, False, True), (lambda e: e.attributes[0].C1, True, True),
        (lambda e: e.signatures[0].Sig, False, False),
        (lambda e: e.signatures[0].P2, False, False)]
    for part, routed, decrypted in parts:
        bad = codec.decode_event(pp.group, planted(data, part(ct)))
        with pytest.raises(GroupError, match="non-canonical"):
            part(bad).raw  # noqa: B018 -- the first use parses
        assert not S.verify(pp, bad)
        assert S.route_test(pp, token, bad) is not routed
        entry = S.route_entry(pp, bad, token.attribute, token.position)
        assert S.route_test_entry(pp, token, entry) is not routed
        if decrypted:
            with pytest.raises(S.DecryptionError):
                S.decrypt(pp, key, bad)


def test_an_entry_unmasking_to_the_identity_is_refused(world: Any) -> None:
    """Whoever knows K_ij (a publisher, or anyone when C1_i is the identity) can make E_ij
    unmask to any 48 bytes; the unmasked C2 is parsed strictly."""
    pp, msk, publisher = world
    key = subscriber(pp, msk, "")
    mine = key.credentials[0]
    ct = S.encrypt_and_sign(pp, publisher, event())
    i, j, event_id = 0, mine.credential.position, ct.header.event_id
    mask = KDF(pp.group.pair(mine.T, ct.attributes[i].C1), S._mask_info(event_id, i, j),
               pp.group.sizes[G1])
    data = codec.encode_event(ct)
    honest = codec.decode_event(pp.group, data)
    assert S.unmask(pp, key, i, mine.credential.attribute, honest, event_id)[0] == mine
    bad = codec.decode_event(pp.group, plant(data, ct.attributes[i].E[j],
                                             S._xor(identity_spelling(G1, 1), mask)))
    with pytest.raises(S.DecryptionError, match="not a G1 element"):
        S.unmask(pp, key, i, mine.credential.attribute, bad, event_id)


def test_a_request_entry_with_a_planted_identity_opens_for_no_token(world: Any) -> None:
    """With U = 1, e(T, U) = 1 for every token: an entry sealed under KDF(1, "cr") would
    open for a holder whose credential does not cover the requester's."""
    pp, msk, _ = world
    server = Ed25519PrivateKey.generate()
    requester = Credential("price", "num", "0110")
    outsider = S.keygen_routing_token(pp, msk, Credential("price", "num", "1001"), EPOCH)
    holder = S.keygen_routing_token(pp, msk, requester, EPOCH)
    request, _ = S.build_connection_request(pp, server, requester, EPOCH, 2**40)
    anchor = Ed25519Server(server.public_key().public_bytes_raw())
    data = codec.encode_request(request)
    honest = codec.decode_request(pp.group, data)
    S.check_connection_request(pp, honest, anchor, time.time(), {EPOCH})
    assert S.open_connection_request(pp, holder, honest) is not None  # control
    assert S.open_connection_request(pp, outsider, honest) is None
    j = outsider.position
    entry = request.entries[j]
    chosen = seal(KDF(pp.group.identity(GT), S.REQUEST_INFO),
                  bytes(S.SW_BYTES) + j.to_bytes(2, "big"), S._request_ad("price", EPOCH, j))
    bad = codec.decode_request(pp.group, plant(planted(data, entry.U), entry.sealed, chosen))
    with pytest.raises(GroupError, match="non-canonical"):
        bad.entries[j].U.raw  # noqa: B018 -- the first use parses
    assert S.open_connection_request(pp, outsider, bad) is None
    with pytest.raises(S.RequestRejected, match="signature"):
        S.check_connection_request(pp, bad, anchor, time.time(), {EPOCH})


def test_certificates_and_stream_events_with_a_planted_identity_are_refused(world: Any) -> None:
    pp, msk, _ = world
    token = subscriber(pp, msk, "").credentials[0].token
    s = stream(world)
    ct = T.stream_encrypt_and_sign(s, stream_values(0))
    certificate = codec.encode_certificate(s.session.certificate)
    assert T.verify_session_certificate(pp, codec.decode_certificate(pp.group, certificate))
    for part in ("Sig", "P2", "R"):
        element = getattr(s.session.certificate.parts[0], part)
        bad = codec.decode_certificate(pp.group, planted(certificate, element))
        with pytest.raises(GroupError, match="non-canonical"):
            getattr(bad.parts[0], part).raw  # noqa: B018 -- the first use parses
        assert not T.verify_session_certificate(pp, bad)
    data = codec.encode_stream_event(ct)
    honest = wire(pp.group, ct)
    assert T.stream_verify(pp, T.StreamCaches(), honest, time.time())  # control
    assert S.route_test(pp, token, honest)
    for element in (ct.C0, ct.attributes[0].C1):
        bad = codec.decode_any_event(pp.group, planted(data, element))
        assert isinstance(bad, type(honest))
        with pytest.raises(GroupError, match="non-canonical"):
            (bad.C0 if element is ct.C0 else bad.attributes[0].C1).raw  # noqa: B018
        assert not T.stream_verify(pp, T.StreamCaches(), bad, time.time())
        assert S.route_test(pp, token, bad) is (element is ct.C0)


# -- the attack -------------------------------------------------------------------------------

def identity_everywhere(pp: S.PublicParams, keys: Sequence[S.PublisherKey],
                        header: EventHeader, plain: S.Event) -> EncryptedEvent:
    """The forgery, for any header and payload: C0 and every C1_i the identity spelled
    ``c0 00 .. 01``; every tag H4(1), as e(T, 1) = 1 for every token T; every E_ij the G1
    identity so spelled, masked under KDF(1); the payload sealed under KDF(1), the Y^s every
    subscriber then computes. Sig_i = P1_i of keys for the header's credentials verifies
    too (e(m, 1) = 1): any publisher could have flooded every tree."""
    group = pp.group
    one, c1 = group.identity(GT), group.unchecked(G2, identity_spelling(G2, 1))
    attributes = tuple(
        AttributeCiphertext(C1=c1, R=(H4(one),) * a.positions, E=tuple(
            S._xor(identity_spelling(G1, 1),
                   KDF(one, S._mask_info(header.event_id, i, j), group.sizes[G1]))
            for j in range(a.positions)))
        for i, a in enumerate(pp.schema.attributes))
    return EncryptedEvent(
        header=header, C0=c1, attributes=attributes,
        sealed=seal(S.payload_key(one, header.event_id), S.payload(plain),
                    codec.encode_header(header)),
        signatures=tuple(AttributeSignature(Sig=k.P1, P2=k.P2) for k in keys))


def test_the_identity_everywhere_forgery_routes_nowhere_and_opens_nowhere(world: Any) -> None:
    """Lax decoding routed the forgery to every token, verified it (signed with a
    publisher's P1) and opened it to the forged body for a subscriber of everything."""
    pp, msk, publisher = world
    matching = subscriber(pp, msk, "price in [40, 45]")
    other = subscriber(pp, msk, "price in [80, 100]")
    everything = subscriber(pp, msk, "")
    honest = codec.decode_event(pp.group, codec.encode_event(
        S.encrypt_and_sign(pp, publisher, event())))
    assert S.decrypt(pp, everything, honest) == event()  # control
    keys = [S.publisher_key_for(publisher, c) for c in honest.header.publisher_credentials]
    forged = codec.decode_event(pp.group, codec.encode_event(identity_everywhere(
        pp, keys, honest.header, event(body=b"the attacker's payload"))))
    # controls: the honest event routes to the matching price credential only ...
    assert any(S.route_test(pp, k.token, honest) for k in matching.for_attribute("price"))
    assert not any(S.route_test(pp, k.token, honest) for k in other.for_attribute("price"))
    # ... and every tag of the forgery is what every token computes from the identity
    tokens = [k.token for key in (matching, other) for k in key.credentials]
    for token in tokens:
        tag = H4(pp.group.pair(token.T, pp.group.identity(G2)))
        assert forged.attributes[pp.schema.index(token.attribute)].R[token.position] == tag
    assert not any(S.route_test(pp, token, forged) for token in tokens)
    assert not S.verify(pp, forged)
    for key in (everything, matching, other):
        with pytest.raises(S.DecryptionError):
            S.decrypt(pp, key, forged)
