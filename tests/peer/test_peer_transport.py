"""Frames and the asyncio transport over real loopback sockets, with mutual TLS under a
test peer-link CA (and plaintext where it is asked for)."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import sys

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from peer_links import FAST, Inbox, secure_peer
from tls_certificates import PeerCA

from ibe_pubsub.credentials.logsafe import EscapingFormatter, escape
from ibe_pubsub.credentials.peer_certificates import PeerCertificateError
from ibe_pubsub.evaluation.bench_transport import run_transport_bench
from ibe_pubsub.peer import frames
from ibe_pubsub.peer import transport as transport_module
from ibe_pubsub.peer.transport import Backoff, Transport, TransportError, split_address


def test_frame_roundtrip_and_rejections():
    wire = frames.encode(frames.data(b"abc"))
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    assert frames.decode_body(wire[4:]) == frames.Frame(frames.DATA, b"abc")
    assert frames.decode_body(frames.encode(frames.hello("h:1"))[4:]).payload == "h:1"
    assert frames.decode_body(frames.encode(frames.end())[4:]) == frames.Frame(frames.END, b"")
    assert frames.decode_body(frames.encode(frames.gap(7))[4:]) == frames.Frame(frames.GAP, 7)
    v = frames.PROTOCOL_VERSION
    bad = [b"\xc1", msgpack.packb([v + 1, 1, b"x"]), msgpack.packb([v - 1, 1, b"x"]),
           msgpack.packb([v, 9, b"x"]),
           msgpack.packb([v, 3, 0]), msgpack.packb([v, 3, -1]), msgpack.packb([v, 3, True]),
           msgpack.packb([v, 3, 1 << 32]), msgpack.packb([v, 3, b"x"]),
           msgpack.packb([v, 1, "text"]), msgpack.packb([v, 0, b"bytes"]),
           msgpack.packb([v, 1]), msgpack.packb({"a": 1}), msgpack.packb([True, 1, b""]),
           msgpack.packb([v, 2, b"x"]), msgpack.packb([v, 2, ""])]
    for body in bad:
        with pytest.raises(frames.FrameError):
            frames.decode_body(body)
    with pytest.raises(frames.FrameError):
        frames.encode(frames.data(b"x" * 100), max_frame=50)


def test_split_address():
    assert split_address("127.0.0.1:80") == ("127.0.0.1", 80)
    assert split_address("[::1]:7") == ("::1", 7)
    for bad in ("nohost", ":80", "h:x", "h:70000"):
        with pytest.raises(TransportError):
            split_address(bad)


def test_backoff_grows_capped_with_jitter():
    b = Backoff(initial=0.1, factor=2, cap=1.0, jitter=0.5)
    rng = random.Random(1)
    delays = [b.delay(i, rng) for i in range(8)]
    assert all(0.05 <= d <= 1.5 for d in delays)
    assert delays[-1] >= 0.5 > delays[0]
    assert len({round(d, 6) for d in delays[5:]}) == 3  # jitter: capped delays still differ


def test_escape_shows_control_characters_and_keeps_printable_text():
    assert escape("127.0.0.1:80 ü") == "127.0.0.1:80 ü"
    assert escape("a\nb\rc\td\x1b[31m\x00\x7f\x85\u2028\u2029\u202e") == \
        "a\\nb\\rc\\td\\x1b[31m\\x00\\x7f\\x85\\u2028\\u2029\\u202e"
    assert escape(escape("x\ny")) == escape("x\ny")


def test_escaping_formatter_escapes_the_line_and_keeps_the_traceback():
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("t", logging.WARNING, __file__, 1, "claimed %s",
                                   ("h:1\nWARNING forged",), sys.exc_info())
    text = formatter.format(record)
    first, *rest = text.splitlines()
    assert first == "WARNING claimed h:1\\nWARNING forged"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


def test_peer_tls_takes_only_a_certificate_for_its_own_key():
    ca, key = PeerCA(), Ed25519PrivateKey.generate()
    tls = ca.credentials(("127.0.0.1:5",), key=key)
    assert tls.certificate.binding.addresses == ("127.0.0.1:5",)
    for context in (tls.server_context, tls.client_context):
        assert context.minimum_version == ssl.TLSVersion.TLSv1_3
        assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname
    with pytest.raises(PeerCertificateError, match="another transport key"):
        tls.install(ca.certificate(Ed25519PrivateKey.generate(), ("127.0.0.1:5",)))
    with pytest.raises(PeerCertificateError, match="not a PEM"):
        tls.install("junk")
    tls.install(ca.certificate(key, ("127.0.0.1:6",)))
    assert tls.certificate.binding.addresses == ("127.0.0.1:6",)


async def _pair(secure: bool = True, **kwargs):
    ia, ib = Inbox(), Inbox()
    if secure:
        ca = PeerCA()
        return (await secure_peer(ca, ia, **kwargs), ia, await secure_peer(ca, ib, **kwargs),
                ib)
    a = Transport(ia, backoff=FAST, secure=False, **kwargs)
    b = Transport(ib, backoff=FAST, secure=False, **kwargs)
    await a.listen("127.0.0.1", 0)
    await b.listen("127.0.0.1", 0)
    return a, ia, b, ib


@pytest.mark.parametrize("secure", [True, False], ids=["tls", "plaintext"])
def test_messages_both_ways_on_one_connection(secure):
    async def main():
        a, ia, b, ib = await _pair(secure)
        for i in range(50):
            a.send(b.address, b"m%d" % i)
        got = await ib.wait_for(50)
        assert got == [(a.address, b"m%d" % i) for i in range(50)]  # in order, named by addr
        b.send(a.address, b"reply")  # answered on the connection a dialed
        assert await ia.wait_for(1) == [(b.address, b"reply")]
        assert len(a._links[b.address].conns) == 1 and len(b._links[a.address].conns) == 1
        ssl_object = a._links[b.address].conns[0].writer.get_extra_info("ssl_object")
        if secure:
            assert ssl_object.version() == "TLSv1.3"
            assert a.peer_certificate(b.address).binding.addresses == (b.address,)
            assert b.peer_certificate(a.address).binding.addresses == (a.address,)
        else:
            assert ssl_object is None and a.peer_certificate(b.address) is None
        assert not (a.refused or b.refused)
        await a.close()
        await b.close()
    asyncio.run(main())


def test_simultaneous_dials_settle_on_one_connection_in_order():
    async def main():
        a, ia, b, ib = await _pair()
        for i in range(20):
            a.send(b.address, b"a%d" % i)
            b.send(a.address, b"b%d" % i)
        await ia.wait_for(20)
        await ib.wait_for(20)
        await asyncio.sleep(2.5)  # past the duplicate drain
        a.send(b.address, b"late")
        await ib.wait_for(21)
        assert len(a._links[b.address].conns) == 1 and len(b._links[a.address].conns) == 1
        # END on the abandoned connection keeps each direction in order.
        assert [p for _, p in ib.items] == [b"a%d" % i for i in range(20)] + [b"late"]
        assert [p for _, p in ia.items] == [b"b%d" % i for i in range(20)]
        await a.close()
        await b.close()
    asyncio.run(main())


def test_frames_on_a_newer_connection_wait_for_the_older_ones_end():
    """A peer moving to a newer connection ends the older one with END (or closes it); what
    it writes on the newer one meanwhile is held, then delivered in the order written."""
    claimed = "127.0.0.1:1"  # certified to the raw client below; nobody listens there

    async def main():
        ca, ib = PeerCA(), Inbox()
        b = await secure_peer(ca, ib)
        client = ca.credentials((claimed,))
        host, port = split_address(b.address)

        async def connect():
            reader, writer = await asyncio.open_connection(host, port, ssl=client.client_context)
            writer.write(frames.encode(frames.hello(claimed)))
            assert (await frames.read_frame(reader)).payload == b.address
            return writer

        def payloads():
            return [p for _, p in ib.items]

        first = await connect()
        first.write(frames.encode(frames.data(b"1")))
        await ib.wait_for(1)
        second = await connect()
        second.write(frames.encode(frames.data(b"3")))
        await asyncio.sleep(0.3)
        assert payloads() == [b"1"]  # held: the first connection has not ended
        first.write(frames.encode(frames.data(b"2")) + frames.encode(frames.end()))
        await ib.wait_for(3)
        assert payloads() == [b"1", b"2", b"3"]
        third = await connect()
        third.write(frames.encode(frames.data(b"5")))
        second.write(frames.encode(frames.data(b"4")))
        await ib.wait_for(4)
        await asyncio.sleep(0.3)  # 5 would be here by now if it were not held
        assert payloads() == [b"1", b"2", b"3", b"4"]
        second.close()  # closing ends it too
        await ib.wait_for(5)
        assert payloads() == [b"1", b"2", b"3", b"4", b"5"]
        assert {sender for sender, _ in ib.items} == {claimed}
        for writer in (first, third):
            writer.close()
        await b.close()
    asyncio.run(main())


def test_reconnects_after_the_neighbour_restarts():
    async def main():
        ca = PeerCA()
        ib = Inbox()
        a, b = await secure_peer(ca, Inbox()), await secure_peer(ca, ib)
        port = int(b.address.rsplit(":", 1)[1])
        a.send(b.address, b"one")
        await ib.wait_for(1)
        await b.close()
        ib2 = Inbox()
        b2 = await secure_peer(ca, ib2, port=port)  # a new key, a new certificate
        for _ in range(3):  # the first send may hit the dead connection
            a.send(b2.address, b"two")
            await asyncio.sleep(0.2)
        await ib2.wait_for(1)
        assert ib2.items[0] == (a.address, b"two")
        await a.close()
        await b2.close()
    asyncio.run(main())


def test_dead_neighbour_is_given_up_without_raising(caplog):
    async def main():
        a, _, b, _ = await _pair()
        dead = b.address
        await b.close()
        a.send(dead, b"lost")
        await asyncio.sleep(1.0)
        assert not a.is_connected(dead) and not a._links[dead].queue
        assert not a.refused  # an unreachable peer is no refusal
        await a.close()
    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert "gave up on" in caplog.text


def test_bad_and_oversized_frames_are_dropped_and_the_link_survives(caplog):
    async def main():
        ca, ib = PeerCA(), Inbox()
        b = await secure_peer(ca, ib, max_frame=1000)
        client = ca.credentials(())  # a non-listening peer: no address
        host, port = split_address(b.address)
        reader, writer = await asyncio.open_connection(host, port, ssl=client.client_context)
        writer.write(frames.encode(frames.hello("")))
        assert (await frames.read_frame(reader)).payload == b.address
        writer.write((5000).to_bytes(4, "big") + b"z" * 5000)  # oversized
        writer.write((3).to_bytes(4, "big") + b"\xc1\xc1\xc1")  # not msgpack
        writer.write(frames.encode(frames.hello("x:1")))  # HELLO again
        writer.write(frames.encode(frames.data(b"good")))
        await writer.drain()
        got = await ib.wait_for(1)
        assert got[0][1] == b"good" and got[0][0].startswith("~127.0.0.1:")
        assert b.peer_certificate(got[0][0]).binding.addresses == ()
        b.send(got[0][0], b"answer")  # a non-listening peer is answered on its connection
        assert (await frames.read_frame(reader)).payload == b"answer"
        writer.close()
        # A client that speaks another protocol version is refused at hello.
        reader, writer = await asyncio.open_connection(host, port, ssl=client.client_context)
        hello = frames.encode(frames.hello(""))
        version = bytes([0x93, frames.PROTOCOL_VERSION])
        writer.write(hello.replace(version, b"\x93\x07", 1))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await frames.read_frame(reader)
        assert b.refused == {"bad_hello": 1}
        writer.close()
        await b.close()
    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert "dropped a frame" in caplog.text and "refused a connection" in caplog.text


def test_credentials_given_after_listening():
    async def main():
        ca, ia, ib = PeerCA(), Inbox(), Inbox()
        a = Transport(ia, backoff=FAST)
        b = Transport(ib, backoff=FAST)
        await a.listen("127.0.0.1", 0)
        await b.listen("127.0.0.1", 0)
        with pytest.raises(TransportError, match="does not name"):
            a.tls = ca.credentials(("127.0.0.1:1",))
        a.tls = ca.credentials((a.address,))
        # b has no credentials yet: it refuses a's dial and dials nothing itself.
        a.send(b.address, b"too early")
        b.send(a.address, b"queued")
        await asyncio.sleep(0.5)
        assert b.refused["not_ready"] >= 1 and not ia.items and not ib.items
        assert b._links[a.address].queue  # kept, not dropped
        b.tls = ca.credentials((b.address,))
        assert await ia.wait_for(1) == [(b.address, b"queued")]
        a.send(b.address, b"now")
        # a's refused "too early" is either still queued (it then comes first) or was given
        # up after a's dial attempts: which depends on how fast the machine is.
        got = await ib.wait_for(1)
        if got[-1] == (a.address, b"too early"):
            got = await ib.wait_for(2)
        assert got in ([(a.address, b"now")], [(a.address, b"too early"), (a.address, b"now")])
        await a.close()
        await b.close()
    asyncio.run(main())
    with pytest.raises(TransportError):
        Transport(Inbox(), secure=False, tls=PeerCA().credentials())
    with pytest.raises(TransportError):
        Transport(Inbox(), secure=False).tls = PeerCA().credentials()


def test_a_message_to_itself_is_handed_back_without_a_socket():
    async def main():
        inbox = Inbox()
        t = Transport(inbox, secure=False)
        await t.listen("127.0.0.1", 0)
        t.send(t.address, b"self")
        assert await inbox.wait_for(1) == [(t.address, b"self")]
        assert t.address not in t._links
        await t.close()
    asyncio.run(main())


@pytest.mark.parametrize("trimmed_by", ["the sender", "congested"])
def test_frames_that_waited_too_long_are_not_written_and_the_gap_is_told_alone(
        monkeypatch, trimmed_by):
    """A reader stops; what its sockets cannot hold waits in the sender's queue past
    MAX_QUEUE_DELAY (made 0 once the queue is still, so no timing matters), and nothing is
    sent after. When it reads again, those frames are dropped, not written late, and it is
    told how many in a GAP with no frame after it: trimmed as they come up for writing, or
    by ``congested`` while the sender waits on the full socket. (Written late before: all
    100 arrived, none told; and with ``congested`` trimming, the count waited for a next
    frame that never came.)"""
    big = b"x" * (256 * 1024)  # 100 of them: more than twice what both sockets hold

    async def main():
        a, _, b, ib = await _pair(secure=False)
        a.send(b.address, b"hello")
        await ib.wait_for(1)
        b.pause_reading(a.address)
        for _ in range(100):
            a.send(b.address, big)
        link, queued = a._links[b.address], -1
        while queued != len(link.queue):  # until the sockets are full
            queued = len(link.queue)
            await asyncio.sleep(0.2)
        assert queued > 1  # the frame being written, and those behind it
        monkeypatch.setattr(transport_module, "MAX_QUEUE_DELAY", 0.0)
        if trimmed_by == "congested":
            assert not a.congested()  # a slow link holds nothing back
            assert a.dropped_by["queue_delay"] == queued - 1
        b.resume_reading(a.address)
        deadline = asyncio.get_running_loop().time() + 10
        while len(ib.items) - 1 + b.missed < 100 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # nothing more comes
        got = len(ib.items) - 1
        assert a.dropped_by["queue_delay"] > 0 and a.dropped == a.dropped_by["queue_delay"]
        assert got + b.missed == 100 and b.missed == a.dropped, (got, b.missed, a.dropped)
        await a.close()
        await b.close()
    asyncio.run(main())


def test_frames_that_waited_for_a_dial_are_sent_not_dropped(monkeypatch):
    """The queueing bound counts from when a link is connected: frames queued while it
    is still dialing (here: until its credentials come, 1 s) are all sent, however short
    the bound. (Timed from when they were queued, all but the first batch were dropped.)"""
    monkeypatch.setattr(transport_module, "MAX_QUEUE_DELAY", 0.5)

    async def main():
        ca, ib = PeerCA(), Inbox()
        b = await secure_peer(ca, ib)
        a = Transport(Inbox(), backoff=FAST)
        await a.listen("127.0.0.1", 0)
        for k in range(300):
            a.send(b.address, b"%04d" % k + b"x" * 1024)
        await asyncio.sleep(1.0)
        a.tls = ca.credentials((a.address,))
        await ib.wait_for(300)
        assert not a.dropped and not b.missed
        await a.close()
        await b.close()
    asyncio.run(main())


def test_bench_transport_times_both_modes():
    result = run_transport_bench(connections=5)
    assert result["connections"] == 5
    assert result["tls_ms"] > 0 and result["plaintext_ms"] > 0
    assert result["tls_overhead_ms"] == pytest.approx(result["tls_ms"] - result["plaintext_ms"],
                                                      abs=0.002)
