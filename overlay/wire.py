"""Overlay messages and their compact wire form (msgpack arrays, strictly validated).

Every message is a frozen dataclass whose first two fields name the sending and
the receiving virtual peer (opaque ids local to a physical peer; ``""`` lets the
receiver pick by attribute). On the wire a message is ``[tag, field, ...]`` in
declaration order. Decoding rejects unknown tags, wrong field counts, wrong
types, oversize strings and oversize frames with :class:`WireError`, so a peer
never acts on a malformed frame. Connection requests, tokens and events travel
as opaque byte strings in the encoding of the crypto suite (credentials/codec.py
for the real one).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import ClassVar

import msgpack

from ibe_pubsub.overlay.exceptions import OverlayError

MAX_FRAME = 4 * 1024 * 1024
MAX_TEXT = 256
MAX_TOKENS = 256
#: Targets of a :class:`Publishes` at most: a peer has a virtual peer per tree, a few per
#: tree at most, and each target costs the receiver a Publish's work.
MAX_TARGETS = 64


class WireError(OverlayError, ValueError):
    """Bytes that are not a well-formed overlay message."""


@dataclass(frozen=True)
class Message:
    """Base: ``src_vp`` is the sender's virtual peer, ``dst_vp`` the receiver's."""

    TAG: ClassVar[int] = 0
    src_vp: str
    dst_vp: str

    def to_bytes(self) -> bytes:
        # The fields in declaration order (``vars`` keeps __init__'s order); no deep copy
        # as ``astuple`` would make: every field is flat (a tuple holds only bytes).
        return msgpack.packb([self.TAG, *vars(self).values()], use_bin_type=True)

    @staticmethod
    def from_bytes(data: bytes) -> Message:
        return decode(data)


@dataclass(frozen=True)
class Join(Message):
    """A connection request on its way through the tree of ``attribute`` (Algorithm 2)."""

    TAG: ClassVar[int] = 1
    attribute: str
    join_id: bytes
    origin: str
    origin_vp: str
    hops: int
    request: bytes
    #: Set on a retry aimed at a full peer that covers the newcomer: split rather than forward.
    split: bool
    #: The newcomer's depth when it seeks a further parent (MCR), else -1.
    depth: int


@dataclass(frozen=True)
class JoinMiss(Message):
    """Nobody in the sender's subtree may adopt ``join_id`` into a free slot: it could not
    open the request, or every peer it passed the request down to answered so. It names
    the deepest peer of that subtree that opened the request and may split for it
    (``depth`` -1: none), so the full peer that began the downward search can have the
    newcomer taken there at once instead of leaving it to its join timeout."""

    TAG: ClassVar[int] = 12
    join_id: bytes
    splitter: str
    splitter_vp: str
    depth: int


@dataclass(frozen=True)
class JoinSplit(Message):
    """The top of a failed downward search asks the deepest peer that may split for
    ``join_id`` (named in a :class:`JoinMiss`) to do so."""

    TAG: ClassVar[int] = 13
    join_id: bytes


@dataclass(frozen=True)
class Recruit(Message):
    """A child with free slots asks its parent to pass its (key-server-signed) request to
    some of the parent's finer children as swap probes: those it covers may move under it."""

    TAG: ClassVar[int] = 14
    join_id: bytes
    request: bytes


@dataclass(frozen=True)
class Accept(Message):
    """The acceptor proves it opened the request (HMAC under SW, or root certificate + sig)."""

    TAG: ClassVar[int] = 2
    join_id: bytes
    proof: bytes
    certificate: bytes


@dataclass(frozen=True)
class Detach(Message):
    """A child drops its link to the receiving parent (surplus accept, leave, swap)."""

    TAG: ClassVar[int] = 3


@dataclass(frozen=True)
class SwapOffer(Message):
    """A peer that could not open ``join_id`` offers itself as the newcomer's child, and names
    its parent (which opened the request but was full) as where a retry may ask for a split,
    with its own depth (-1 if unknown): the deepest such parent is the best place."""

    TAG: ClassVar[int] = 4
    join_id: bytes
    request: bytes
    parent: str
    parent_vp: str
    depth: int


@dataclass(frozen=True)
class SwapAccept(Message):
    """The newcomer opened the offerer's request and adopted it as a child."""

    TAG: ClassVar[int] = 5
    join_id: bytes
    proof: bytes


@dataclass(frozen=True)
class SwapHandover(Message):
    """The swapped child asks its old parent to put the newcomer of ``join_id`` in its place."""

    TAG: ClassVar[int] = 6
    join_id: bytes


@dataclass(frozen=True)
class Tokens(Message):
    """Multi-credential routing: the routing tokens the parent routes on for this child."""

    TAG: ClassVar[int] = 7
    tokens: tuple[bytes, ...]


@dataclass(frozen=True)
class Ping(Message):
    """Child-to-parent heartbeat."""

    TAG: ClassVar[int] = 8


@dataclass(frozen=True)
class Pong(Message):
    """Parent's answer: ``ok`` false if the sender is not its child; its depth (-1 detached);
    and its own nearest remote parent (``""`` if none), which the child may ask to be its
    backup (a leaving parent would hand it to that peer anyway)."""

    TAG: ClassVar[int] = 9
    ok: bool
    depth: int
    ancestor: str
    ancestor_vp: str


@dataclass(frozen=True)
class Handover(Message):
    """A leaving parent tells its children to rejoin at its own parent."""

    TAG: ClassVar[int] = 10
    new_parent: str
    new_parent_vp: str


@dataclass(frozen=True)
class Publish(Message):
    """An encrypted event travelling down the tree of ``attribute``."""

    TAG: ClassVar[int] = 11
    attribute: str
    event: bytes


@dataclass(frozen=True)
class Publishes(Message):
    """One event for several of the receiver's virtual peers at once (the trees two peers
    share, or a publisher's roots in one process): the event travels once and is taken as
    a :class:`Publish` per target ``(src_vps[k], dst_vps[k], attributes[k])``, in that
    order. ``src_vp`` and ``dst_vp`` are empty. At most :data:`MAX_TARGETS` targets."""

    TAG: ClassVar[int] = 18
    src_vps: tuple[str, ...]
    dst_vps: tuple[str, ...]
    attributes: tuple[str, ...]
    event: bytes

    def __post_init__(self) -> None:
        if self.src_vp or self.dst_vp or not (
                0 < len(self.src_vps) == len(self.dst_vps) == len(self.attributes)
                <= MAX_TARGETS):
            raise WireError(f"Publishes: no virtual peers of its own, 1 to {MAX_TARGETS} "
                            "targets, each with a sender, a receiver and an attribute")

    def expand(self) -> list[Publish]:
        """A Publish per target, each target once (a repeated one would only cost work)."""
        targets = dict.fromkeys(zip(self.src_vps, self.dst_vps, self.attributes, strict=True))
        return [Publish(src, dst, attribute, self.event) for src, dst, attribute in targets]


def coalesced(messages: list[Publish]) -> list[Publish | Publishes]:
    """The copies of one event for one physical peer as one message, or several of at most
    :data:`MAX_TARGETS` targets (a copy alone goes as itself)."""
    chunks = (messages[k:k + MAX_TARGETS] for k in range(0, len(messages), MAX_TARGETS))
    return [chunk[0] if len(chunk) == 1 else Publishes(
        "", "", tuple(m.src_vp for m in chunk), tuple(m.dst_vp for m in chunk),
        tuple(m.attribute for m in chunk), chunk[0].event) for chunk in chunks]


@dataclass(frozen=True)
class Watch(Message):
    """Asks a covering ancestor to be the sender's backup: it must open ``request`` (the
    sender's key-server-signed connection request) and prove so with an :class:`Accept`."""

    TAG: ClassVar[int] = 15
    join_id: bytes
    request: bytes


@dataclass(frozen=True)
class Digest(Message):
    """A backup's IHAVE: ids (16-byte ciphertext digests) of the recent events that
    reached the backup, each with its digest entry (what the receiver's route test at its
    own position reads of it): the receiver tests them with its own token."""

    TAG: ClassVar[int] = 16
    ids: tuple[bytes, ...]
    entries: tuple[bytes, ...]


@dataclass(frozen=True)
class Pull(Message):
    """IWANT: the ids of a :class:`Digest` the sender lacks; each is served once."""

    TAG: ClassVar[int] = 17
    ids: tuple[bytes, ...]


#: Length of an event id in a :class:`Digest` or :class:`Pull`.
EVENT_ID_BYTES = 16

MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.TAG: cls for cls in (Join, JoinMiss, JoinSplit, Recruit, Accept, Detach, SwapOffer,
                             SwapAccept, SwapHandover, Tokens, Ping, Pong, Handover, Publish,
                             Publishes, Watch, Digest, Pull)}
_HINTS = {tag: [(f.name, typing.get_type_hints(cls)[f.name]) for f in fields(cls)]
          for tag, cls in MESSAGE_TYPES.items()}


def _check(name: str, hint: object, value: object) -> object:
    if hint is str:
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise WireError(f"field {name!r} must be a string of at most {MAX_TEXT} characters")
    elif hint is bytes:
        if not isinstance(value, bytes):
            raise WireError(f"field {name!r} must be bytes")
    elif hint is bool:
        if not isinstance(value, bool):
            raise WireError(f"field {name!r} must be a boolean")
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value < 2**32:
            raise WireError(f"field {name!r} must be a small integer")
    else:  # tuple[str, ...] or tuple[bytes, ...]
        item = typing.get_args(hint)[0]
        if not isinstance(value, list) or len(value) > MAX_TOKENS or not all(
                isinstance(v, item) and (item is bytes or len(v) <= MAX_TEXT) for v in value):
            what = ("byte strings" if item is bytes
                    else f"strings of at most {MAX_TEXT} characters")
            raise WireError(f"field {name!r} must be a list of at most {MAX_TOKENS} {what}")
        if name == "ids" and any(len(v) != EVENT_ID_BYTES for v in value):
            raise WireError(f"field 'ids' must hold {EVENT_ID_BYTES}-byte event ids")
        return tuple(value)
    return value


def decode(data: bytes) -> Message:
    """Parse and validate one frame; raise :class:`WireError` on anything unexpected."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_FRAME:
        raise WireError("frame is not bytes or exceeds the size limit")
    try:
        items = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise WireError(f"frame is not msgpack: {exc}") from None
    if not isinstance(items, list) or not items or not isinstance(items[0], int):
        raise WireError("frame is not a tagged message")
    cls = MESSAGE_TYPES.get(items[0])
    if cls is None or isinstance(items[0], bool):
        raise WireError(f"unknown message type {items[0]!r}")
    hints = _HINTS[items[0]]
    if len(items) != len(hints) + 1:
        raise WireError(f"{cls.__name__}: expected {len(hints)} fields, got {len(items) - 1}")
    values = [_check(name, hint, v) for (name, hint), v in zip(hints, items[1:], strict=True)]
    return cls(*values)
