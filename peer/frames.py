"""The peer-to-peer frame format: a 4-byte big-endian length, then a msgpack envelope.

The envelope is ``[version, kind, payload]``. ``HELLO`` opens every connection in
both directions and carries the sender's dialable address (``""`` for a peer that
does not listen, such as a publisher), so both ends name the link the same way.
``DATA`` carries one overlay message as opaque bytes (overlay/wire.py parses it).
``END`` (no payload) says the sender writes no more DATA on this connection because it
moved to a newer one to the same peer (a duplicate settled, a certificate renewed): the
receiver delivers what arrives on the newer connection only after the older one's END,
so the switch keeps the order of the frames.
``GAP`` carries a count: the sender dropped that many DATA frames queued for this receiver
(its queue was full, or the receiver read too slowly; see peer/transport.py), so the
receiver can count what it missed.
A frame whose length exceeds the limit, or whose envelope is malformed or of
another protocol version, raises :class:`FrameError`: the caller drops it and logs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgpack

from ibe_pubsub.peer.exceptions import PeerError

#: 2: overlay messages may be a ``Publishes`` (one event for several virtual peers), which
#: a peer of version 1 would drop; peers of different versions refuse each other at HELLO.
PROTOCOL_VERSION = 2
HELLO = 0
DATA = 1
END = 2
GAP = 3
#: The largest count a GAP frame carries (a larger gap is told in several).
MAX_GAP = (1 << 32) - 1
HEADER = 4
#: Large enough for an overlay message (overlay.wire.MAX_FRAME) plus the envelope.
DEFAULT_MAX_FRAME = 4 * 1024 * 1024 + 1024
MAX_ADDRESS = 300
_DISCARD_CHUNK = 64 * 1024


class FrameError(PeerError, ValueError):
    """Bytes that are not a frame of this protocol; the frame is dropped."""


@dataclass(frozen=True)
class Frame:
    kind: int
    payload: bytes | str | int
    #: Bytes on the wire, length prefix included, of a frame read from a stream (0 for
    #: one built here); for the transport's byte counters.
    size: int = field(default=0, compare=False)


def encode(frame: Frame, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The bytes on the wire for one frame (refuses to produce an oversized frame)."""
    body = msgpack.packb([PROTOCOL_VERSION, frame.kind, frame.payload], use_bin_type=True)
    if len(body) > max_frame:
        raise FrameError(f"frame of {len(body)} bytes exceeds the limit of {max_frame}")
    return len(body).to_bytes(HEADER, "big") + body


def hello(address: str) -> Frame:
    return Frame(HELLO, address)


def data(payload: bytes) -> Frame:
    return Frame(DATA, payload)


def end() -> Frame:
    return Frame(END, b"")


def gap(count: int) -> Frame:
    return Frame(GAP, count)


def decode_body(body: bytes) -> Frame:
    """Parse one envelope (without its length prefix) strictly."""
    try:
        items = msgpack.unpackb(body, raw=False, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise FrameError(f"envelope is not msgpack: {exc}") from None
    if not isinstance(items, list) or len(items) != 3:
        raise FrameError("envelope is not a [version, kind, payload] array")
    version, kind, payload = items
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise FrameError(f"protocol version {version!r} is not {PROTOCOL_VERSION}")
    if kind == HELLO and not isinstance(kind, bool):
        if not isinstance(payload, str) or len(payload) > MAX_ADDRESS:
            raise FrameError("HELLO must carry an address string")
    elif kind == DATA and not isinstance(kind, bool):
        if not isinstance(payload, bytes):
            raise FrameError("DATA must carry bytes")
    elif kind == END and not isinstance(kind, bool):
        if payload != b"":
            raise FrameError("END carries no payload")
    elif kind == GAP and not isinstance(kind, bool):
        if not isinstance(payload, int) or isinstance(payload, bool) \
                or not 1 <= payload <= MAX_GAP:
            raise FrameError(f"GAP must carry a count from 1 to {MAX_GAP}")
    else:
        raise FrameError(f"unknown frame kind {kind!r}")
    return Frame(kind, payload, HEADER + len(body))


async def read_frame(reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME) -> Frame:
    """Read the next frame. An oversized frame is skipped (its bytes discarded, never
    buffered) and reported with :class:`FrameError`, so the stream stays in sync.
    Raises ``asyncio.IncompleteReadError`` at end of stream."""
    length = int.from_bytes(await reader.readexactly(HEADER), "big")
    if length > max_frame:
        remaining = length
        while remaining:
            chunk = await reader.read(min(remaining, _DISCARD_CHUNK))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(chunk)
        raise FrameError(f"dropped a frame of {length} bytes (limit {max_frame})")
    return decode_body(await reader.readexactly(length))
