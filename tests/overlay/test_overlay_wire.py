"""The overlay wire format: round trips and strict rejection of malformed frames."""

import msgpack
import pytest

from ibe_pubsub.overlay.wire import (
    MESSAGE_TYPES,
    Accept,
    Detach,
    Digest,
    Handover,
    Join,
    JoinMiss,
    JoinSplit,
    Message,
    Ping,
    Pong,
    Publish,
    Pull,
    Recruit,
    SwapAccept,
    SwapHandover,
    SwapOffer,
    Tokens,
    Watch,
    WireError,
    decode,
)

SAMPLES: list[Message] = [
    Join("a", "b", "price", b"j" * 16, "h:1", "vp", 7, b"req", True, 3),
    JoinMiss("a", "b", b"j" * 16, "h:4", "s", 2),
    JoinSplit("a", "b", b"j" * 16),
    Recruit("a", "b", b"j" * 16, b"req"),
    Accept("a", "b", b"j", b"proof", b""),
    Detach("a", "b"),
    SwapOffer("a", "b", b"j", b"req", "h:2", "p", 3),
    SwapAccept("a", "b", b"j", b"proof"),
    SwapHandover("a", "b", b"j"),
    Tokens("a", "b", (b"t1", b"t2")),
    Ping("a", ""),
    Pong("a", "b", False, -1, "h:5", "g"),
    Handover("a", "b", "h:3", "q"),
    Publish("", "", "symbol", b"event"),
    Watch("a", "b", b"j" * 16, b"req"),
    Digest("a", "b", (b"i" * 16, b"k" * 16), (b"e1", b"e2")),
    Pull("a", "b", (b"i" * 16,)),
]


def test_every_message_type_round_trips():
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES.values())
    for m in SAMPLES:
        assert decode(m.to_bytes()) == m
        assert Message.from_bytes(m.to_bytes()) == m


@pytest.mark.parametrize("items", [
    [99, "a", "b"],                       # unknown type
    [8, "a"],                             # missing field
    [8, "a", "b", "extra"],               # extra field
    [9, "a", "b", 1, 2, "", ""],          # int for bool
    [9, "a", "b", True, True, "", ""],    # bool for int
    [9, "a", "b", True, 1],               # a pong without its ancestor
    [16, "a", "b", [b"short"]],           # an event id of the wrong length
    [17, "a", "b", [b"i" * 17]],
    [17, "a", "b", [b"i" * 16] * 257],    # a pull of too many ids
    [15, "a", "b", b"j" * 16],            # a watch without its request
    [1, "a", "b", "price", "not-bytes", "o", "v", 1, b"r", False, -1],
    [7, "a", "b", [b"ok", "str"]],        # token list with a string
    [8, "a" * 300, "b"],                  # oversize text
    {"t": 1},                             # not a tagged array
    [],
    [True, "a", "b"],
])
def test_malformed_frames_are_rejected(items):
    with pytest.raises(WireError):
        decode(msgpack.packb(items, use_bin_type=True))


def test_garbage_and_oversize_frames_are_rejected():
    for data in (b"", b"\xc1", b"\x92\x08", msgpack.packb([8, "a", "b"]) + b"x",
                 b"\x00" * (5 * 1024 * 1024)):
        with pytest.raises(WireError):
            decode(data)
