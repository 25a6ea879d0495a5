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
    Publishes,
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
    Publishes("", "", ("a", "b"), ("c", ""), ("symbol", "price"), b"event"),
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
    [18, "", "", [], [], [], b"e"],       # an event for no one
    [18, "", "", ["a"], ["b", "c"], ["p"], b"e"],  # targets that do not line up
    [18, "", "", ["a"] * 65, ["b"] * 65, ["p"] * 65, b"e"],  # too many targets
    [18, "", "", ["a"], [b"b"], ["p"], b"e"],  # bytes for a virtual peer
    [18, "", "", ["a"], ["b" * 300], ["p"], b"e"],  # oversize text in a list
    [18, "", "", ["a"], ["b"], ["p"], "not-bytes"],
    [18, "", "vp", ["a"], ["b"], ["p"], b"e"],  # names a virtual peer of its own
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


def test_the_copies_of_an_event_for_one_peer_travel_once_and_in_order():
    from ibe_pubsub.overlay.actions import Log, Send, coalesce

    event, other = b"e" * 100, b"f" * 100
    actions = [Send("x", Publish("r1", "s1", "symbol", event)),
               Send("y", Publish("r1", "t1", "symbol", event)),
               Log("info", "between"),
               Send("x", Publish("r2", "s2", "price", event)),
               Send("x", Publish("r2", "s2", "price", other)),
               Send("y", Ping("r2", "t2")),  # closes y's group: the next copy comes after it
               Send("y", Publish("r3", "t3", "volume", event))]
    out = coalesce(actions)
    assert out == [Send("x", Publishes("", "", ("r1", "r2"), ("s1", "s2"), ("symbol", "price"),
                                       event)),
                   Send("y", Publish("r1", "t1", "symbol", event)),
                   Log("info", "between"),
                   Send("x", Publish("r2", "s2", "price", other)),
                   Send("y", Ping("r2", "t2")),
                   Send("y", Publish("r3", "t3", "volume", event))]
    assert out[0].message.expand() == [actions[0].message, actions[3].message]
    assert decode(out[0].message.to_bytes()).expand() == out[0].message.expand()
    assert coalesce(actions[:3]) == actions[:3]  # nothing to merge: left as it was


def test_more_copies_than_a_message_takes_go_as_several_and_repeats_are_taken_once():
    from ibe_pubsub.overlay.actions import Send, coalesce
    from ibe_pubsub.overlay.wire import MAX_TARGETS

    copies = [Publish(f"r{k}", f"s{k}", "symbol", b"event") for k in range(MAX_TARGETS * 2 + 1)]
    out = coalesce([Send("x", m) for m in copies])
    assert [len(s.message.src_vps) for s in out[:2]] == [MAX_TARGETS, MAX_TARGETS]
    assert out[2] == Send("x", copies[-1])
    assert [m for s in out[:2] for m in s.message.expand()] + [out[2].message] == copies
    repeated = Publishes("", "", ("a", "a", "b"), ("c", "c", "c"), ("p", "p", "p"), b"e")
    assert repeated.expand() == [Publish("a", "c", "p", b"e"), Publish("b", "c", "p", b"e")]
