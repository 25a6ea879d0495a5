"""Attacks on the peer links of a threshold deployment, over real sockets on 127.0.0.1 with
real mutual TLS. There the CA that TLS checks is public (every peer derives its key from
the deployment's signing key ``X``, and so can an attacker): what vouches for a link is
the signature of a quorum of members (``ceil((n + t) / 2)``, 4 of 5 here) over its key,
binding and expiry, which each side checks right after the handshake. So every attack
here mints its own certificate under that CA, and each is refused on both sides, with
nothing delivered either way; the control is an honest certificate of the same
deployment, which goes through.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from peer_links import FAST, Inbox, secure_peer
from tls_certificates import PeerCA, ThresholdLinks

from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.credentials.certificates import peer_link_message
from ibe_pubsub.credentials.codec import TAG_QUORUM_SIGNATURE, Writer
from ibe_pubsub.credentials.peer_certificates import (
    HANDSHAKE_CA_NAME,
    LINK_SIGNATURE_EXTENSION,
    PEER_EXTENSION,
    PEER_NAME,
    PeerBinding,
    PeerCertificateError,
    issue_peer_certificate,
    read_peer_certificate,
    to_pem,
)
from ibe_pubsub.peer.tls import PeerTLS
from ibe_pubsub.peer.transport import Transport

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def links():
    return ThresholdLinks()


class TakesAnything:
    """A "signature check" that passes everything: what an attacker's own peer runs, and
    the control that shows the real check is what refuses."""

    def verify(self, message: bytes, signature: bytes) -> bool:
        return True


def attacker_tls(links: ThresholdLinks, key: Ed25519PrivateKey, pem: str) -> PeerTLS:
    return PeerTLS(key, pem, links.pem, links=TakesAnything())


def test_peers_of_a_deployment_link_with_its_signature_and_see_each_others_binding(links):
    async def main():
        ia, ib = Inbox(), Inbox()
        a, b = await secure_peer(links, ia), await secure_peer(links, ib)
        a.send(b.address, b"to b")
        assert await ib.wait_for(1) == [(a.address, b"to b")]
        b.send(a.address, b"to a")
        assert await ia.wait_for(1) == [(b.address, b"to a")]
        assert a.peer_certificate(b.address).binding.addresses == (b.address,)
        assert b.peer_certificate(a.address).binding.addresses == (a.address,)
        assert not (a.refused or b.refused)
        for peer in (a, b):
            await peer.close()
    asyncio.run(main())


def unsigned(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """A version-2 style certificate of the public handshake CA's key: no signature."""
    now = time.time()
    return to_pem(issue_peer_certificate(links.ca_key, key.public_key(), mallory(address),
                                         now, now + 3600))


def mallory(address: str) -> PeerBinding:
    return PeerBinding("mallory", "subscriber", (address,), (), 1)


def forged(links: ThresholdLinks, key: Ed25519PrivateKey, address: str,
           sign: Callable[[bytes, PeerBinding, int], bytes], *,
           shown: PeerBinding | None = None, life: float = 3600.0) -> str:
    """A certificate of ``key`` under the public handshake CA carrying ``sign(link key,
    mallory's binding at address, in an hour)``, and saying ``shown`` (that binding by
    default) until ``life`` seconds from now: what is signed and what the certificate
    says may differ."""
    binding, now = mallory(address), time.time()
    signature = sign(key.public_key().public_bytes_raw(), binding, int(now + 3600))
    return to_pem(issue_peer_certificate(links.ca_key, key.public_key(), shown or binding, now,
                                         int(now + life), link_signature=signature))


def no_signature(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """A signature of no one: 48 zero bytes."""
    return forged(links, key, address, lambda *_: bytes(48))


def copied_signature(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """An honest peer's binding, expiry and signature, with the attacker's key."""
    honest = links.certificate(Ed25519PrivateKey.generate(), (address,), identity="alice")
    return swap_key(links, honest, key)


def swap_key(links: ThresholdLinks, pem: str, key: Ed25519PrivateKey) -> str:
    """``pem`` re-issued for ``key``, every extension kept."""
    cert = x509.load_pem_x509_certificate(pem.encode())
    builder = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
               .public_key(key.public_key()).serial_number(cert.serial_number)
               .not_valid_before(cert.not_valid_before_utc)
               .not_valid_after(cert.not_valid_after_utc))
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return to_pem(builder.sign(links.ca_key, None))


def another_binding(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """The members signed this key as a subscriber: the certificate says root."""
    return forged(links, key, address, links.sign,
                  shown=PeerBinding("mallory", "root", (address,), ("symbol",), 1))


def longer_life(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """Signed until in an hour; the certificate says tomorrow."""
    return forged(links, key, address, links.sign, life=86400)


def only_t(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """``t`` members' signatures, fewer than the quorum that keeps an address one
    identity's. (With partial signatures of ``x`` instead, ``t`` would give every member's
    by interpolation, which the first version of this design missed: the quorum signs with
    independent keys.)"""
    return forged(links, key, address, lambda *signed: links.sign(*signed, (1, 2, 3)))


def one_signer_twice(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """Three members' signatures, one of them listed twice to make up the quorum."""
    def sign(link_key: bytes, binding: PeerBinding, not_after: int) -> bytes:
        signed = links.signatures(link_key, binding, not_after, (1, 2, 3))
        w = Writer(TAG_QUORUM_SIGNATURE).u8(4)
        for index in (1, 1, 2, 3):
            w.u8(index).fixed(signed[index])
        return w.done()
    return forged(links, key, address, sign)


def outsiders(links: ThresholdLinks, key: Ed25519PrivateKey, address: str) -> str:
    """Three members' signatures and one made with a key that is no member's."""
    def sign(link_key: bytes, binding: PeerBinding, not_after: int) -> bytes:
        signed = links.signatures(link_key, binding, not_after, (1, 2, 3))
        signed[4] = Ed25519PrivateKey.generate().sign(
            links.links.scope + peer_link_message(link_key, binding.to_bytes(), not_after))
        return T.encode_quorum_signature(signed)
    return forged(links, key, address, sign)


FORGERIES = [no_signature, copied_signature, another_binding, longer_life, only_t,
             one_signer_twice, outsiders]


@pytest.mark.parametrize("forge", FORGERIES, ids=[f.__name__ for f in FORGERIES])
def test_certificates_minted_under_the_public_ca_are_refused_in_both_directions(links, forge):
    async def main():
        inbox, bad_inbox = Inbox(), Inbox()
        victim = await secure_peer(links, inbox)
        bad = Transport(bad_inbox, backoff=FAST)
        await bad.listen("127.0.0.1", 0)
        key = Ed25519PrivateKey.generate()
        bad.tls = attacker_tls(links, key, forge(links, key, bad.address))
        # It dials the victim: the handshake completes, the signature check refuses it.
        bad.send(victim.address, b"let me in")
        await asyncio.sleep(1.0)
        assert victim.refused["bad_certificate"] >= 1 and set(victim.refused) == {
            "bad_certificate"}
        assert not inbox.items
        # The victim dials it: refused likewise, and the victim sends nothing.
        before = victim.refused["bad_certificate"]
        victim.send(bad.address, b"secret")
        await asyncio.sleep(1.0)
        assert victim.refused["bad_certificate"] == before + 1 and not bad_inbox.items
        # Control: a peer that skips the signature check (the CA alone) takes the forgery,
        # so the check is what refused it.
        naive_inbox, naive_key = Inbox(), Ed25519PrivateKey.generate()
        naive = Transport(naive_inbox, backoff=FAST)
        await naive.listen("127.0.0.1", 0)
        naive.tls = attacker_tls(links, naive_key,
                                 links.certificate(naive_key, (naive.address,)))
        bad.send(naive.address, b"let me in")
        assert await naive_inbox.wait_for(1) == [(bad.address, b"let me in")]
        await naive.close()
        # Control: the same key with the deployment's certificate goes through both ways.
        bad.tls = links.credentials((bad.address,), key=key)
        bad.send(victim.address, b"let me in")
        assert await inbox.wait_for(1) == [(bad.address, b"let me in")]
        victim.send(bad.address, b"secret")
        assert await bad_inbox.wait_for(1) == [(victim.address, b"secret")]
        for peer in (victim, bad):
            await peer.close()
    asyncio.run(main())


def test_peers_of_another_deployment_or_of_a_version_2_ca_do_not_complete_a_handshake(links):
    other, v2 = ThresholdLinks(b"another deployment"), PeerCA()

    async def main():
        inbox = Inbox()
        victim = await secure_peer(links, inbox)
        for ca in (other, v2):
            stranger_inbox = Inbox()
            stranger = await secure_peer(ca, stranger_inbox)
            stranger.send(victim.address, b"hello")  # it finds the victim's CA foreign
            victim.send(stranger.address, b"secret")  # and the victim finds its CA foreign
            await asyncio.sleep(1.5)
            assert stranger.refused["foreign_ca"] >= 1 and not stranger_inbox.items
            await stranger.close()
        assert victim.refused["foreign_ca"] == 2 and not inbox.items
        # Control: a peer of this deployment gets through.
        member = await secure_peer(links, Inbox())
        member.send(victim.address, b"hello")
        assert await inbox.wait_for(1) == [(member.address, b"hello")]
        for peer in (victim, member):
            await peer.close()
    asyncio.run(main())


def test_a_peer_takes_no_certificate_of_its_own_without_the_signature(links):
    key = Ed25519PrivateKey.generate()
    with pytest.raises(PeerCertificateError, match="version-2 certificate"):
        PeerTLS(key, unsigned(links, key, "127.0.0.1:9"), links.pem, links=links.links)
    # Nor links under the public handshake CA without the check at all, alone or in a
    # bundle with another CA.
    for cas in (links.pem, PeerCA().pem + links.pem):
        with pytest.raises(PeerCertificateError, match="public handshake CA"):
            PeerTLS(key, links.certificate(key, ("127.0.0.1:9",)), cas)
    assert PeerTLS(key, links.certificate(key, ("127.0.0.1:9",)), links.pem,
                   links=links.links).certificate.binding.addresses == ("127.0.0.1:9",)


def mint(links: ThresholdLinks, public_key: object, binding: bytes, signature: bytes,
         not_after: datetime.datetime | None = None) -> x509.Certificate:
    """Whatever certificate an attacker likes, under the public handshake CA."""
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(PEER_NAME).issuer_name(HANDSHAKE_CA_NAME)
            .public_key(public_key).serial_number(1).not_valid_before(now)
            .not_valid_after(not_after or now + datetime.timedelta(hours=2))
            .add_extension(x509.UnrecognizedExtension(PEER_EXTENSION, binding), critical=False)
            .add_extension(x509.UnrecognizedExtension(LINK_SIGNATURE_EXTENSION, signature),
                           critical=False)
            .sign(links.ca_key, None))


def test_hostile_certificate_contents_are_refused_before_the_binding_is_read(links):
    key = Ed25519PrivateKey.generate()
    honest = x509.load_pem_x509_certificate(links.certificate(key, ("127.0.0.1:9",)).encode())
    binding = honest.extensions.get_extension_for_oid(PEER_EXTENSION).value.value
    signature = honest.extensions.get_extension_for_oid(LINK_SIGNATURE_EXTENSION).value.value
    # A binding nested deeper than the JSON parser recurses, and signatures of nothing.
    nested = b"[" * 100_000 + b"]" * 100_000
    for cert in (mint(links, key.public_key(), nested, signature),
                 mint(links, key.public_key(), binding, b"\x00" * 48),
                 mint(links, key.public_key(), binding, signature[:-1]),
                 mint(links, key.public_key(), binding, b"")):
        with pytest.raises(PeerCertificateError, match="does not verify"):
            read_peer_certificate(cert, links.links)
    # Another kind of key, with the honest binding and signature.
    p256 = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(PeerCertificateError, match="not an Ed25519 link key"):
        read_peer_certificate(mint(links, p256, binding, signature), links.links)
    # Control: the honest certificate passes, and so does one minted anew for its key,
    # binding and expiry (the rest of a certificate vouches for nothing); one second more
    # of life does not.
    signed_end = honest.not_valid_after_utc
    for cert in (honest, mint(links, key.public_key(), binding, signature, signed_end)):
        assert read_peer_certificate(cert, links.links).binding.addresses == ("127.0.0.1:9",)
    with pytest.raises(PeerCertificateError, match="does not verify"):
        read_peer_certificate(mint(links, key.public_key(), binding, signature,
                                   signed_end + datetime.timedelta(seconds=1)), links.links)


def test_a_quorums_signatures_count_in_their_own_deployment_only(links):
    """Member keys may outlive a set-up (a set-up run again keeps them): the same members'
    signatures for another deployment (another id and X) are refused here."""
    other = ThresholdLinks(b"a later set-up", member_keys=links.member_keys)
    key = Ed25519PrivateKey.generate()
    foreign = x509.load_pem_x509_certificate(other.certificate(key, ("127.0.0.1:9",)).encode())
    with pytest.raises(PeerCertificateError, match="does not verify"):
        read_peer_certificate(foreign, links.links)
    # Control: there, and here for a certificate signed here, they pass.
    assert read_peer_certificate(foreign, other.links).binding.addresses == ("127.0.0.1:9",)
    own = x509.load_pem_x509_certificate(links.certificate(key, ("127.0.0.1:9",)).encode())
    assert read_peer_certificate(own, links.links).binding.addresses == ("127.0.0.1:9",)
