"""Frames and the asyncio transport over real loopback sockets (plain and TLS)."""

from __future__ import annotations

import asyncio
import random
import ssl

import msgpack
import pytest
from tls_certificates import self_signed

from peer import frames
from peer.transport import Backoff, Transport, TransportError, split_address


class Inbox:
    """Collects (sender, payload) and lets a test wait for a count."""

    def __init__(self) -> None:
        self.items: list[tuple[str, bytes]] = []
        self.changed = asyncio.Event()

    def __call__(self, sender: str, payload: bytes) -> None:
        self.items.append((sender, payload))
        self.changed.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[tuple[str, bytes]]:
        async def loop() -> None:
            while len(self.items) < count:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)
        return self.items


FAST = Backoff(initial=0.05, cap=0.2, attempts=4)


def test_frame_roundtrip_and_rejections():
    wire = frames.encode(frames.data(b"abc"))
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    assert frames.decode_body(wire[4:]) == frames.Frame(frames.DATA, b"abc")
    assert frames.decode_body(frames.encode(frames.hello("h:1"))[4:]).payload == "h:1"
    bad = [b"\xc1", msgpack.packb([2, 1, b"x"]), msgpack.packb([1, 9, b"x"]),
           msgpack.packb([1, 1, "text"]), msgpack.packb([1, 0, b"bytes"]),
           msgpack.packb([1, 1]), msgpack.packb({"a": 1}), msgpack.packb([True, 1, b""])]
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


async def _pair(ssl_server=None, ssl_client=None, max_frame=frames.DEFAULT_MAX_FRAME):
    ia, ib = Inbox(), Inbox()
    a = Transport(ia, backoff=FAST, ssl_server=ssl_server, ssl_client=ssl_client,
                  max_frame=max_frame)
    b = Transport(ib, backoff=FAST, ssl_server=ssl_server, ssl_client=ssl_client,
                  max_frame=max_frame)
    await a.listen("127.0.0.1", 0)
    await b.listen("127.0.0.1", 0)
    return a, ia, b, ib


def test_messages_both_ways_on_one_connection():
    async def main():
        a, ia, b, ib = await _pair()
        for i in range(50):
            a.send(b.address, b"m%d" % i)
        got = await ib.wait_for(50)
        assert got == [(a.address, b"m%d" % i) for i in range(50)]  # in order, named by addr
        b.send(a.address, b"reply")  # answered on the connection a dialed
        assert await ia.wait_for(1) == [(b.address, b"reply")]
        assert len(a._links[b.address].conns) == 1 and len(b._links[a.address].conns) == 1
        await a.close()
        await b.close()
    asyncio.run(main())


def test_simultaneous_dials_settle_on_one_connection():
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
        assert sorted(p for _, p in ib.items) == sorted([b"a%d" % i for i in range(20)]
                                                        + [b"late"])
        await a.close()
        await b.close()
    asyncio.run(main())


def test_reconnects_after_the_neighbour_restarts():
    async def main():
        a, _, b, ib = await _pair()
        port = int(b.address.rsplit(":", 1)[1])
        a.send(b.address, b"one")
        await ib.wait_for(1)
        await b.close()
        ib2 = Inbox()
        b2 = Transport(ib2, backoff=FAST)
        await b2.listen("127.0.0.1", port)
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
        await a.close()
    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert "gave up on" in caplog.text


def test_bad_and_oversized_frames_are_dropped_and_the_link_survives(caplog):
    async def main():
        ib = Inbox()
        b = Transport(ib, max_frame=1000)
        await b.listen("127.0.0.1", 0)
        host, port = split_address(b.address)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(frames.encode(frames.hello("")))
        assert (await frames.read_frame(reader)).payload == b.address
        writer.write((5000).to_bytes(4, "big") + b"z" * 5000)  # oversized
        writer.write((3).to_bytes(4, "big") + b"\xc1\xc1\xc1")  # not msgpack
        writer.write(frames.encode(frames.hello("x:1")))  # HELLO again
        writer.write(frames.encode(frames.data(b"good")))
        await writer.drain()
        got = await ib.wait_for(1)
        assert got[0][1] == b"good" and got[0][0].startswith("~127.0.0.1:")
        b.send(got[0][0], b"answer")  # a non-listening peer is answered on its connection
        assert (await frames.read_frame(reader)).payload == b"answer"
        writer.close()
        # A client that speaks another protocol version is refused at hello.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(frames.encode(frames.hello("")).replace(b"\x93\x01", b"\x93\x07", 1))
        with pytest.raises(asyncio.IncompleteReadError):
            await frames.read_frame(reader)
        await b.close()
    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert "dropped a frame" in caplog.text and "refused a connection" in caplog.text


def test_tls(tmp_path):
    from peer.tls import client_context, server_context
    cert, key = self_signed(tmp_path)

    async def main():
        server, client = server_context(cert, key, cert), client_context(cert, cert, key)
        a, _, b, ib = await _pair(server, client)
        a.send(b.address, b"secret")
        assert (await ib.wait_for(1))[0][1] == b"secret"
        # A plain-TCP client cannot talk to a TLS peer.
        plain = Transport(Inbox(), backoff=Backoff(initial=0.01, attempts=1))
        plain.send(b.address, b"x")
        await asyncio.sleep(0.5)
        assert not plain.is_connected(b.address) and len(ib.items) == 1
        for t in (a, b, plain):
            await t.close()
    asyncio.run(main())
    assert isinstance(client_context(cert), ssl.SSLContext)


def test_a_message_to_itself_is_handed_back_without_a_socket():
    async def main():
        inbox = Inbox()
        t = Transport(inbox)
        await t.listen("127.0.0.1", 0)
        t.send(t.address, b"self")
        assert await inbox.wait_for(1) == [(t.address, b"self")]
        assert t.address not in t._links
        await t.close()
    asyncio.run(main())
