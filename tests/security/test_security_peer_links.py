"""Attacks on peer links, over real sockets on 127.0.0.1 with real mutual TLS under a test
peer-link CA. Each refusal is checked by its counter and by the victim's
handler having received nothing from the attacker, and has a control: the same step with
proper credentials goes through.

A peer's name on a link is an address its certificate binds: a dialer claiming another
address, a listener whose certificate names another address, a certificate of another CA,
an expired one or none are refused. Strings the attacker chose reach the logs escaped.
What a peer writes on a newer connection of its link while the older one is open is held
within caps, the rest left unread in the socket. Certificates renewed before they expire
replace the links' connections without losing or reordering a frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from peer_links import FAST, Inbox, secure_peer
from tls_certificates import PeerCA

from ibe_pubsub.peer import frames
from ibe_pubsub.peer.tls import PeerTLS
from ibe_pubsub.peer.transport import (
    MAX_CONNECTIONS_PER_IDENTITY,
    MAX_HANDSHAKES,
    HoldLimits,
    Transport,
    split_address,
)

# serial: renewals race certificate expiry in seconds; beside another test process one lost
pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]


async def raw_link(to: Transport, claim: str, context: ssl.SSLContext | None, *payloads: bytes
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An attacker's hand-made connection: (TLS with ``context``,) HELLO claiming ``claim``,
    then DATA frames, written without waiting for an answer."""
    host, port = split_address(to.address)
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    writer.write(frames.encode(frames.hello(claim)))
    for payload in payloads:
        writer.write(frames.encode(frames.data(payload)))
    await writer.drain()
    return reader, writer


async def answered(reader: asyncio.StreamReader) -> bool:
    """Whether the victim answered the HELLO (False: it closed the connection)."""
    try:
        frame = await asyncio.wait_for(frames.read_frame(reader), 5)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        return False
    return frame.kind == frames.HELLO


async def settle() -> None:
    """Long enough for a refused connection's frames to have been delivered, were they."""
    await asyncio.sleep(0.3)


def test_spoofed_hello_without_tls_is_refused():
    async def main():
        ca, inbox = PeerCA(), Inbox()
        parent, victim = await secure_peer(ca, Inbox()), await secure_peer(ca, inbox)
        reader, writer = await raw_link(victim, parent.address, None, b"join", b"ping")
        assert not await answered(reader)
        await settle()
        assert victim.refused == {"tls": 1} and not inbox.items
        assert not victim.is_connected(parent.address)
        writer.close()
        # Control: the parent itself gets through, named by its certified address.
        parent.send(victim.address, b"real")
        assert await inbox.wait_for(1) == [(parent.address, b"real")]
        assert victim.refused == {"tls": 1}
        for t in (parent, victim):
            await t.close()
    asyncio.run(main())


def test_spoofed_hello_with_a_certificate_for_another_address_is_refused():
    """The mutual-TLS variant of the eclipse: a peer of the same CA claims the victim's
    parent's address."""
    async def main():
        ca, inbox, parent_inbox = PeerCA(), Inbox(), Inbox()
        parent, victim = await secure_peer(ca, parent_inbox), await secure_peer(ca, inbox)
        attacker = await secure_peer(ca, Inbox())
        victim.send(parent.address, b"join")
        await parent_inbox.wait_for(1)
        reader, writer = await raw_link(victim, parent.address, attacker.tls.client_context,
                                        b"spoofed")
        assert not await answered(reader)
        await settle()
        assert victim.refused == {"address_mismatch": 1} and not inbox.items
        writer.close()
        # The victim's real link to its parent still carries frames both ways.
        assert victim.peer_certificate(parent.address).binding.addresses == (parent.address,)
        victim.send(parent.address, b"after")
        parent.send(victim.address, b"from parent")
        assert [p for _, p in await parent_inbox.wait_for(2)] == [b"join", b"after"]
        assert await inbox.wait_for(1) == [(parent.address, b"from parent")]
        # Control: the same certificate claiming its own address is accepted.
        reader, writer = await raw_link(victim, attacker.address, attacker.tls.client_context,
                                        b"honest")
        assert await answered(reader)
        assert (await inbox.wait_for(2))[1] == (attacker.address, b"honest")
        assert victim.refused == {"address_mismatch": 1}
        writer.close()
        for t in (parent, victim, attacker):
            await t.close()
    asyncio.run(main())


def test_dialing_a_listener_certified_for_another_address_is_refused():
    async def main():
        ca, impostor_inbox, honest_inbox = PeerCA(), Inbox(), Inbox()
        victim = await secure_peer(ca, Inbox())
        honest = await secure_peer(ca, honest_inbox)
        # A real certificate of the CA, for another address (the setter would refuse it).
        impostor = Transport(impostor_inbox, backoff=FAST,
                             tls=ca.credentials((honest.address,)))
        await impostor.listen("127.0.0.1", 0)
        victim.send(impostor.address, b"secret")
        await asyncio.sleep(1.0)
        assert victim.refused == {"address_mismatch": 1}
        assert not impostor_inbox.items and not victim.is_connected(impostor.address)
        assert victim.dropped == 1
        # Control: the listener certified for the address dialed gets the frame.
        victim.send(honest.address, b"secret")
        assert await honest_inbox.wait_for(1) == [(victim.address, b"secret")]
        assert victim.refused == {"address_mismatch": 1}
        for t in (victim, honest, impostor):
            await t.close()
    asyncio.run(main())


def foreign_credentials(ca: PeerCA, addresses: tuple[str, ...]) -> PeerTLS:
    """A certificate of another CA key (under the same CA name), trusting the real CA,
    whose certificate is public."""
    key = Ed25519PrivateKey.generate()
    return PeerTLS(key, PeerCA().certificate(key, addresses), ca.pem)


def expired_credentials(ca: PeerCA, addresses: tuple[str, ...]) -> PeerTLS:
    return ca.credentials(addresses, issued=time.time() - 7200, lifetime=3600)


@pytest.mark.parametrize("make, reason", [(foreign_credentials, "foreign_ca"),
                                          (expired_credentials, "expired")],
                         ids=["foreign_ca", "expired"])
def test_bad_certificates_are_refused_in_both_directions(make, reason):
    async def main():
        ca, inbox, bad_inbox = PeerCA(), Inbox(), Inbox()
        victim = await secure_peer(ca, inbox)
        bad = Transport(bad_inbox, backoff=FAST)
        await bad.listen("127.0.0.1", 0)
        bad.tls = make(ca, (bad.address,))
        # It dials the victim: the victim refuses its certificate.
        bad.send(victim.address, b"let me in")
        await asyncio.sleep(1.0)
        assert victim.refused[reason] >= 1 and set(victim.refused) == {reason}
        assert not inbox.items
        # The victim dials it: the victim refuses its certificate, sends nothing.
        before = victim.refused[reason]
        victim.send(bad.address, b"secret")
        await asyncio.sleep(1.0)
        assert victim.refused[reason] == before + 1 and not bad_inbox.items
        # Control: with a proper certificate, both directions go through.
        bad.tls = ca.credentials((bad.address,))
        bad.send(victim.address, b"let me in")
        assert await inbox.wait_for(1) == [(bad.address, b"let me in")]
        victim.send(bad.address, b"secret")
        assert await bad_inbox.wait_for(1) == [(victim.address, b"secret")]
        assert victim.refused[reason] == before + 1
        for t in (victim, bad):
            await t.close()
    asyncio.run(main())


def test_a_connection_without_a_client_certificate_is_refused():
    async def main():
        ca, inbox = PeerCA(), Inbox()
        victim = await secure_peer(ca, inbox)
        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.check_hostname = False
        anonymous.load_verify_locations(cadata=ca.pem)  # it trusts the victim, shows nothing
        reader, writer = await raw_link(victim, "", anonymous, b"anonymous")
        assert not await answered(reader)
        await settle()
        assert victim.refused == {"no_certificate": 1} and not inbox.items
        writer.close()
        # Control: the same connection with a certificate is accepted.
        reader, writer = await raw_link(victim, "", ca.credentials().client_context, b"certified")
        assert await answered(reader)
        assert (await inbox.wait_for(1))[0][1] == b"certified"
        assert victim.refused == {"no_certificate": 1}
        writer.close()
        await victim.close()
    asyncio.run(main())


FORGED = "2026-01-01 00:00:00,000 WARNING peer.node: root accepted"


def forged_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(FORGED)]


def transport_log_of(scenario: Callable[[], Coroutine[Any, Any, None]]
                     ) -> list[logging.LogRecord]:
    """Run ``scenario`` and return what the transport logged meanwhile."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("ibe_pubsub.peer.transport")
    logger.addHandler(handler)
    try:
        asyncio.run(scenario())
    finally:
        logger.removeHandler(handler)
    return records


def test_one_identity_cannot_hoard_a_peers_connections():
    """Any enrolled identity may connect, but not without bound: beyond
    MAX_CONNECTIONS_PER_IDENTITY at once it is refused. Control: another identity still
    gets in."""
    async def main():
        ca, inbox = PeerCA(), Inbox()
        victim = await secure_peer(ca, inbox, refusal_log_interval=60)
        hoarder = ca.credentials((), identity="hoarder")
        held = []
        for _ in range(MAX_CONNECTIONS_PER_IDENTITY + 4):
            reader, writer = await raw_link(victim, "", hoarder.client_context)
            held.append((await answered(reader), writer))
        assert [ok for ok, _ in held].count(True) == MAX_CONNECTIONS_PER_IDENTITY
        assert victim.refused == {"too_many_connections": 4}
        other = ca.credentials((), identity="publisher")
        reader, writer = await raw_link(victim, "", other.client_context, b"event")
        assert await answered(reader)
        assert (await inbox.wait_for(1))[0][1] == b"event"
        for _, w in [*held, (None, writer)]:
            w.close()
        await victim.close()
    asyncio.run(main())


def test_strangers_stalling_handshakes_are_bounded():
    """TCP connections that never start TLS hold a handshake slot each until the timeout;
    beyond MAX_HANDSHAKES the peer refuses at once ("busy") instead of running out of file
    descriptors. Control: once they are gone, a peer with a certificate connects."""
    async def main():
        ca, inbox = PeerCA(), Inbox()
        victim = await secure_peer(ca, inbox, refusal_log_interval=60)
        host, port = split_address(victim.address)
        stalled = [await asyncio.open_connection(host, port) for _ in range(MAX_HANDSHAKES)]
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection(host, port)
        assert await reader.read(1) == b""  # closed at once
        assert victim.refused == {"busy": 1}
        for _, w in [*stalled, (None, writer)]:
            w.close()
        await asyncio.sleep(0.3)
        reader, writer = await raw_link(victim, "", ca.credentials(()).client_context, b"hi")
        assert await answered(reader)
        assert (await inbox.wait_for(1))[0][1] == b"hi"
        writer.close()
        await victim.close()
    asyncio.run(main())


CLAIMED = "127.0.0.1:1"  # certified to the peers below, which dial but do not listen
#: Frames a hostile peer writes on each newer connection of its link, and their size.
FLOOD, FLOOD_SIZE = 300, 1000
LIFTED = HoldLimits(10**9, 10**12, 10**9, 10**12)


def data(*payloads: bytes) -> bytes:
    return b"".join(frames.encode(frames.data(p)) for p in payloads)


async def link_connection(victim: Transport, tls: PeerTLS) -> asyncio.StreamWriter:
    """A connection of the peer at :data:`CLAIMED` to ``victim``, once ``victim`` took it."""
    reader, writer = await raw_link(victim, CLAIMED, tls.client_context)
    assert await answered(reader)
    return writer


def watch_held(victim: Transport) -> dict[str, int]:
    """The most ``victim`` ever held for links moving to a newer connection, under the names
    of :class:`HoldLimits`' fields; taken after every DATA frame it reads."""
    peak = dict.fromkeys((f.name for f in dataclasses.fields(HoldLimits)), 0)
    arrived = victim._arrived

    def watched(link: Any, conn: Any, payload: bytes) -> bool:
        done = arrived(link, conn, payload)
        conns = [*link.conns, conn]
        now = dict(zip(peak, (max(len(c.held) for c in conns),
                              max(c.held_bytes for c in conns), *link.held()), strict=True))
        peak.update({name: max(peak[name], now[name]) for name in peak})
        return done

    victim._arrived = watched  # type: ignore[method-assign]
    return peak


def within(peak: dict[str, int], hold: HoldLimits) -> bool:
    return all(peak[name] <= limit for name, limit in dataclasses.asdict(hold).items())


async def flood_newer_connections(hold: HoldLimits) -> tuple[dict[str, int], int, Transport]:
    """A certified peer writes one frame on a connection of its link that it then leaves
    open without END, and :data:`FLOOD` frames on each of two newer ones; returns what the
    victim held at most and the frames it had read a second later (before the first
    connection's drain ends), and the victim, closed."""
    ca, inbox = PeerCA(), Inbox()
    victim = await secure_peer(ca, inbox, hold=hold, refusal_log_interval=60)
    peak = watch_held(victim)
    hostile = ca.credentials((CLAIMED,), identity="mallory")
    first = await link_connection(victim, hostile)
    first.write(data(b"first"))
    await inbox.wait_for(1)
    newer = [await link_connection(victim, hostile) for _ in range(2)]
    for writer in newer:
        writer.write(data(*(bytes(FLOOD_SIZE) for _ in range(FLOOD))))  # never drained
    await asyncio.sleep(1.0)
    read = victim.frames_received
    for writer in (first, *newer):
        writer.close()
    await victim.close()
    return peak, read, victim


@pytest.mark.parametrize("hold", [HoldLimits(32, 1 << 20, 48, 1 << 20),
                                  HoldLimits(10**4, 24 * FLOOD_SIZE, 10**4, 40 * FLOOD_SIZE)],
                         ids=["frames", "bytes"])
def test_a_certified_peer_cannot_make_another_hold_frames_without_bound(hold):
    """Frames on newer connections of a link wait for the older one's END, but only up to
    the caps, per connection and per link: past them the victim reads no more from that
    connection (the frames stay in the sockets) and counts ``held_full``. Control: with
    the caps lifted, the same peer makes the victim read and hold everything it sends."""
    peak, read, victim = asyncio.run(flood_newer_connections(hold))
    assert within(peak, hold), peak
    assert peak["link_frames"] == hold.link_frames \
        or peak["link_bytes"] > hold.link_bytes - FLOOD_SIZE, peak  # the link's cap bound
    assert read <= 1 + peak["link_frames"] + 2  # and one frame in hand per newer connection
    assert set(victim.refused) == {"held_full"} and victim.refused["held_full"] >= 2

    peak, read, victim = asyncio.run(flood_newer_connections(LIFTED))
    assert peak["link_frames"] == read - 1 == 2 * FLOOD  # held all it was sent
    assert peak["link_bytes"] == 2 * FLOOD * FLOOD_SIZE
    assert not within(peak, hold)
    assert not victim.refused


def test_an_honest_hand_over_past_the_caps_pauses_reading_and_loses_nothing():
    """A peer that writes more on a newer connection than the caps allow before its END
    crosses the older one is merely read later: every frame arrives, in the order written,
    and the victim never holds more than the caps. As before, closing the older connection
    ends it too."""
    hold = HoldLimits(connection_frames=8, connection_bytes=1 << 20, link_frames=8,
                      link_bytes=1 << 20)
    numbered = [b"%d" % i for i in range(301)]

    async def main():
        ca, inbox = PeerCA(), Inbox()
        victim = await secure_peer(ca, inbox, hold=hold, refusal_log_interval=60)
        peak = watch_held(victim)
        peer = ca.credentials((CLAIMED,))

        def payloads() -> list[bytes]:
            return [p for _, p in inbox.items]

        first = await link_connection(victim, peer)
        first.write(data(numbered[0]))
        await inbox.wait_for(1)
        second = await link_connection(victim, peer)
        second.write(data(*numbered[2:150]))
        await asyncio.sleep(0.3)
        assert payloads() == numbered[:1]
        assert victim.frames_received == 1 + hold.connection_frames + 1  # held, and in hand
        first.write(data(numbered[1]) + frames.encode(frames.end()))
        await inbox.wait_for(150)
        assert payloads() == numbered[:150]
        third = await link_connection(victim, peer)
        third.write(data(*numbered[151:]))
        second.write(data(numbered[150]))
        await asyncio.sleep(0.3)
        assert payloads() == numbered[:151]
        second.close()
        await inbox.wait_for(301)
        assert payloads() == numbered
        assert within(peak, hold)
        assert victim.refused == {"held_full": 2}  # each newer connection paused once
        for writer in (first, third):
            writer.close()
        await victim.close()
    asyncio.run(main())


def test_hostile_strings_reach_the_log_escaped():
    claims = [f"127.0.0.1:1\n{FORGED} 127.0.0.1:2", f"x\r\n{FORGED}", f"\x1b[2K\r{FORGED}:9",
              f"127.0.0.1:1\u2028{FORGED}:9"]

    async def main():
        ca, inbox = PeerCA(), Inbox()
        victim = await secure_peer(ca, inbox, refusal_log_interval=0)  # a line per refusal
        # A certificate of the CA whose identity name carries a forged line, too.
        attacker = ca.credentials(("127.0.0.1:3",), identity=f"mallory\n{FORGED}")
        for claim in claims:
            reader, writer = await raw_link(victim, claim, attacker.client_context, b"x")
            assert not await answered(reader)
            writer.close()
        await settle()
        assert sum(victim.refused.values()) == len(claims) and not inbox.items
        await victim.close()

    records = transport_log_of(main)
    messages = [r.getMessage() for r in records if "refused a connection" in r.getMessage()]
    assert len(messages) == len(claims)
    assert any("mallory\\n" in m for m in messages)  # the identity name was logged, escaped
    raw = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    for record in records:
        text = raw.format(record)
        assert not forged_lines(text), text
        assert not any(c in text for c in "\r\x1b\u2028\u2029"), text
    # Control: the same record with the claim as sent would have forged a line.
    claim = claims[0]
    assert forged_lines(raw.format(logging.LogRecord(
        "ibe_pubsub.peer.transport", logging.WARNING, __file__, 1, "refused %s", (claim,), None)))


def test_a_flood_of_refused_connections_is_counted_but_logged_once():
    """Each refusal is counted; log lines are coalesced per reason, so hostile connections
    cannot fill the disk. Control: the last line sums up the ones not logged."""
    async def main():
        ca, inbox = PeerCA(), Inbox()
        victim = await secure_peer(ca, inbox, refusal_log_interval=3.0)
        attacker = ca.credentials(("127.0.0.1:3",))
        for i in range(30):
            if i == 29:
                await asyncio.sleep(3.1)  # past the interval: the next refusal is logged
            reader, writer = await raw_link(victim, "127.0.0.1:4", attacker.client_context,
                                            b"x")
            assert not await answered(reader)
            writer.close()
        await settle()
        assert victim.refused == {"address_mismatch": 30} and not inbox.items
        await victim.close()

    records = transport_log_of(main)
    lines = [r.getMessage() for r in records if "refused a connection" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "and 28 more for this reason" in lines[1]


async def _stream(a: Transport, b: Transport, seconds: float, interval: float = 0.005) -> int:
    """Numbered frames both ways, continuously, for ``seconds``; returns how many each."""
    count = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        a.send(b.address, b"%d" % count)
        b.send(a.address, b"%d" % count)
        count += 1
        await asyncio.sleep(interval)
    return count


async def _maintain(transports: list[Transport], renew_before: float) -> None:
    """The node's tick."""
    while True:
        for t in transports:
            t.maintain(time.time(), renew_before)
        await asyncio.sleep(0.1)


LIFETIME = 4.0


async def _rotation_pair(ca: PeerCA) -> tuple[Transport, Inbox, Ed25519PrivateKey,
                                              Transport, Inbox, Ed25519PrivateKey]:
    ia, ib = Inbox(), Inbox()
    key_a, key_b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    a = await secure_peer(ca, ia, key=key_a, lifetime=LIFETIME)
    b = await secure_peer(ca, ib, key=key_b, lifetime=LIFETIME)
    if b.address < a.address:  # a is the preferred dialer of the link
        a, ia, key_a, b, ib, key_b = b, ib, key_b, a, ia, key_a
    return a, ia, key_a, b, ib, key_b


def test_renewed_certificates_replace_the_connection_without_losing_a_frame():
    async def main():
        ca = PeerCA()
        a, ia, key_a, b, ib, key_b = await _rotation_pair(ca)
        expiry = a.tls.certificate.not_after
        ticker = asyncio.get_running_loop().create_task(_maintain([a, b], renew_before=10))
        stream = asyncio.get_running_loop().create_task(
            _stream(a, b, seconds=expiry - time.time() + 1.5))
        await asyncio.sleep(0.8)
        old = a._writable(a._links[b.address])
        assert old.expires == expiry
        # The epoch rolls over: both peers install renewed certificates.
        a.tls.install(ca.certificate(key_a, (a.address,)))
        b.tls.install(ca.certificate(key_b, (b.address,)))
        count = await stream
        assert time.time() > expiry + 1  # the stream ran past the old certificates' end
        expected = [b"%d" % i for i in range(count)]
        await ia.wait_for(count, timeout=10)
        await ib.wait_for(count, timeout=10)
        assert [p for _, p in ib.items] == expected  # complete and in order, a -> b
        assert [p for _, p in ia.items] == expected  # and b -> a
        assert (a.renewals, b.renewals) == (1, 0)
        assert (a.expired_links, b.expired_links) == (0, 0)
        for t, other in ((a, b), (b, a)):
            conns = t._links[other.address].conns
            assert len(conns) == 1 and conns[0] is not old and conns[0].expires > expiry + 3000
        assert not (a.refused or b.refused)
        ticker.cancel()
        for t in (a, b):
            await t.close()
    asyncio.run(main())


def test_without_renewal_the_link_is_dropped_at_expiry():
    async def main():
        ca = PeerCA()
        a, ia, _, b, ib, _ = await _rotation_pair(ca)
        expiry = a.tls.certificate.not_after
        ticker = asyncio.get_running_loop().create_task(_maintain([a, b], renew_before=10))
        count = await _stream(a, b, seconds=1.0)
        await ib.wait_for(count)
        await ia.wait_for(count)
        assert a.is_connected(b.address) and b.is_connected(a.address)
        await asyncio.sleep(expiry - time.time() + 0.5)
        assert (a.expired_links, b.expired_links) == (1, 1)
        assert (a.renewals, b.renewals) == (0, 0)
        assert not a.is_connected(b.address) and not b.is_connected(a.address)
        # No new connection can be made with the expired certificates.
        a.send(b.address, b"late")
        await asyncio.sleep(1.0)
        assert a.refused == {"expired": 1} and len(ib.items) == count
        ticker.cancel()
        for t in (a, b):
            await t.close()
    asyncio.run(main())
