"""A virtual peer: one credential's position in one attribute tree, with its links.

A physical peer runs one virtual peer per (attribute, credential) it holds
(report 7.1), and a root peer one per attribute tree it roots. A link end is a
:data:`Node`: the physical address and the virtual peer id there.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ibe_pubsub.credentials import Credential
from ibe_pubsub.overlay.crypto import RootKit, VirtualKeys
from ibe_pubsub.overlay.lifecycle import Lifecycle

Node = tuple[str, str]
K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """A FIFO-evicting map of bounded size: the memory of duplicate suppression."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def get(self, key: K) -> V | None:
        return self._data.get(key)

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def expire(self, stale: Callable[[V], bool]) -> None:
        """Drop the oldest entries as long as ``stale`` says they are (for entries put in
        the order they age)."""
        while self._data:
            key, value = next(iter(self._data.items()))
            if not stale(value):
                return
            del self._data[key]


def comes_first(position: int, vp_id: str, other_position: int, other_vp_id: str) -> bool:
    """The link order: a coarser credential first, then a smaller virtual peer id (a
    relay's id extends its creator's, a root's starts with '.', below every hex digit)."""
    return position < other_position or (position == other_position and vp_id < other_vp_id)


@dataclass
class ParentLink:
    last_heard: float
    #: The parent's distance to the root, None while unknown or detached.
    depth: int | None = None
    #: When the link was made: only events that came after it are owed by the parent.
    since: float = 0.0
    #: MCR: when the tokens dealt to it last changed; it owes nothing from before either.
    dealt: float = 0.0
    #: The parent proved itself the tree's root (or its relay) with the root certificate:
    #: every event enters there, so it needs no second parent beside it.
    root: bool = False
    #: For each of the last events it owed (see :mod:`overlay.demotion`): missed or not.
    gaps: deque[bool] = field(default_factory=lambda: deque(maxlen=16))
    #: Digests of the last events it sent, its own record: no other sender's traffic (junk
    #: included) pushes them out, so an old event replayed by another parent after this
    #: peer's duplicate memory forgot it does not count as one this parent missed. (A
    #: local link remembers nothing: it is never checked.)
    sent: Bounded[bytes, None] = field(default_factory=lambda: Bounded(0))


@dataclass
class ChildLink:
    last_heard: float
    #: Position of the child's credential (from its connection request): a child can only
    #: cover a newcomer at least as fine as itself, and only be covered by a coarser one.
    position: int = 0
    #: Nonce of the request the child was adopted with: a recruit must carry that request.
    nonce: bytes = b""
    #: Routing tokens the child handed over (multi-credential routing): bytes -> decoded.
    tokens: dict[bytes, Any] = field(default_factory=dict)
    #: Tokens the child's last update took away, still routed on until ``withdrawn_until``:
    #: the parent that takes them over may have passed an event on before it learnt them.
    withdrawn: dict[bytes, Any] = field(default_factory=dict)
    withdrawn_until: float = 0.0


@dataclass
class WatchLink:
    """A virtual peer this one backs up (see ``OverlayConfig.repair``)."""

    last_heard: float
    #: The position of its credential (learnt by opening its request, as a parent does):
    #: which tag of an event its digest entries carry.
    position: int
    #: Nonce of the request it was accepted with: one link per request and peer.
    nonce: bytes = b""
    #: (time received here, event id, digest entry) of events not yet listed to it.
    pending: list[tuple[float, bytes, bytes]] = field(default_factory=list)
    #: Ids listed to it and not pulled yet: each may be pulled once.
    offered: Bounded[bytes, None] = field(default_factory=lambda: Bounded(256))


@dataclass
class BackupLink:
    """A covering ancestor that backs this virtual peer up."""

    last_heard: float
    #: Event ids pulled from it and not arrived yet: only these may come from it. Kept per
    #: backup, so that one backup's digests cannot evict what another was asked for.
    pulled: Bounded[bytes, None]
    #: Digests from it before this time are dropped: each may cost route tests.
    next_digest_at: float = 0.0
    #: When the link was made, the ids its digests listed, and for each of the last events
    #: it owed this peer (see :mod:`overlay.demotion`): whether it failed to list it.
    since: float = 0.0
    listed: Bounded[bytes, None] = field(default_factory=lambda: Bounded(256))
    gaps: deque[bool] = field(default_factory=lambda: deque(maxlen=16))
    #: Its last digest was full (``digest_entries``): it may have left events out.
    full: bool = False


@dataclass
class PendingJoin:
    """A connection request this virtual peer sent out and may still get accepted."""

    sent_at: float
    epoch: int
    #: Sent to recruit finer peers: only swap offers answer it, and an attached peer
    #: may take them.
    recruit: bool = False
    #: The directory contact it was sent to ("" when sent to a known peer of the tree).
    contact: str = ""
    #: Someone accepted it or offered a swap for it.
    answered: bool = False
    #: Sent to find a backup (see ``Joining.search_backup``): whoever accepts it is asked
    #: to be one, not kept as a parent.
    backup: bool = False


@dataclass
class SwapOffered:
    """This virtual peer offered to become a child of ``newcomer``, leaving ``old_parent``."""

    old_parent: Node
    newcomer: Node
    epoch: int


@dataclass
class VirtualPeer:
    vp: str
    attribute: str
    credential: Credential
    #: Subscriber keys per epoch (empty for a root).
    keys: dict[int, VirtualKeys] = field(default_factory=dict)
    #: Root material per epoch (empty for a subscriber).
    roots: dict[int, RootKit] = field(default_factory=dict)
    parents: dict[Node, ParentLink] = field(default_factory=dict)
    children: dict[Node, ChildLink] = field(default_factory=dict)
    #: Children that left by a swap -> (link, until when they still get events): the new
    #: parent may have passed an event on before it adopted them.
    released: dict[Node, tuple[ChildLink, float]] = field(default_factory=dict)
    joins: dict[bytes, PendingJoin] = field(default_factory=dict)
    swaps: dict[bytes, SwapOffered] = field(default_factory=dict)
    #: MCR: which token bytes each parent was given.
    assignment: dict[Node, tuple[bytes, ...]] = field(default_factory=dict)
    #: When the current (re)join began, None while fully connected.
    join_started: float | None = None
    next_join_at: float = 0.0
    link_attempts: int = 0
    next_ping_at: float = 0.0
    #: Heartbeat rounds so far (backups are pinged every few rounds).
    pings: int = 0
    #: Parents left by a swap -> until when their events are still taken: what they sent
    #: before they let this peer go must not be lost.
    former: dict[str, float] = field(default_factory=dict)
    #: Parents that left and handed this peer over: told (``Detach``) once it has a new
    #: parent, so that they stop serving it.
    handed_over: set[Node] = field(default_factory=set)
    #: Recruiting rounds left since the last new parent, and when the next one is due.
    recruits_left: int = 0
    next_recruit_at: float = 0.0
    #: A full peer that covers this one, learnt from a swap offer: where to ask for a split
    #: (with the position of the offerer that named it, to keep the deepest).
    split_hint: tuple[int, Node] | None = None
    #: A relay is a copy of its parent made by a split: same keys, one parent, own token.
    relay: bool = False
    #: Repair: covering ancestors that send this peer digests, and the ones asked to
    #: (``Watch`` join id -> (ancestor, when asked)).
    backups: dict[Node, BackupLink] = field(default_factory=dict)
    watch_asks: dict[bytes, tuple[Node, float]] = field(default_factory=dict)
    #: Digest entry -> whether it passed this peer's own token (the answer depends on the
    #: entry's bytes alone, whatever id a backup pairs it with).
    tested: Bounded[bytes, bool] = field(default_factory=lambda: Bounded(256))
    #: Peers this one backs up, and when it next sends them digests.
    watchers: dict[Node, WatchLink] = field(default_factory=dict)
    next_digest_at: float = 0.0
    #: Physical peers demoted as parents -> until when their acceptances are refused.
    shunned: dict[str, float] = field(default_factory=dict)
    #: Push backups: when the next rotation of parents is due, and until when the current
    #: one takes a third parent (0: none under way).
    next_rotate_at: float = 0.0
    rotating_until: float = 0.0
    #: The pull repair: when a virtual peer without backups next searches for one itself.
    next_backup_search_at: float = 0.0

    @property
    def is_root(self) -> bool:
        return bool(self.roots)

    def precedes(self, position: int, vp_id: str) -> bool:
        """May this virtual peer, if it covers the other, be its parent? Links only ever
        go down the order (:func:`comes_first`), so they can never close a cycle, however
        stale what a peer knows of the tree; the tree's top comes before everyone."""
        return self.is_top or comes_first(self.credential.position, self.vp, position, vp_id)

    @property
    def is_top(self) -> bool:
        """The root of the tree itself (a root's relay has a parent)."""
        return self.is_root and not self.relay

    @property
    def beside_root(self) -> bool:
        """Has a parent on the root's peer (proven by the root's certificate in its
        acceptance, not by a depth it claims), where every event enters?"""
        return any(link.root for link in self.parents.values())

    @property
    def state(self) -> Lifecycle:
        """Read off the links, so it cannot disagree with them (see :mod:`overlay.lifecycle`)."""
        if self.is_top or self.parents:
            return Lifecycle.ATTACHED
        return Lifecycle.DETACHED if self.join_started is None else Lifecycle.JOINING

    @property
    def attached(self) -> bool:
        return self.state is Lifecycle.ATTACHED

    @property
    def depth(self) -> int | None:
        if self.is_top:
            return 0
        # Longest path to the root: strictly larger for every descendant, even in a DAG.
        known = [p.depth for p in self.parents.values() if p.depth is not None]
        return max(known) + 1 if known else None
