"""The overlay protocol as a sans-I/O state machine (report 7.1-7.4, Algorithm 2).

A :class:`PeerMachine` is one physical peer. It is driven only by its methods:
messages (:meth:`receive`), timer ticks (:meth:`tick`), and the user's
:meth:`join`, :meth:`publish`, :meth:`leave`, :meth:`rekey`; each returns a list of
actions (:mod:`overlay.actions`). It holds no sockets and reads no clock or
randomness except the ``now`` and the seeded ``random.Random`` it is given, so
the asyncio peer and the simulator run exactly the same protocol code.

Any message that does not decode, check or fit the machine's state is dropped
with a :class:`~overlay.actions.Log` action and changes nothing else.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ibe_pubsub.overlay.actions import Action, Connected, Deliver, Log, Send
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoRejected, CryptoSuite, RootKit, SubscriberKit
from ibe_pubsub.overlay.virtual import (
    BackupLink,
    Bounded,
    ChildLink,
    Node,
    ParentLink,
    PendingJoin,
    SwapOffered,
    VirtualPeer,
    WatchLink,
    comes_first,
)
from ibe_pubsub.overlay.wire import (
    EVENT_ID_BYTES,
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

#: A virtual peer pings its backups every this many heartbeats (they are a second path,
#: so detecting their failure can wait; it saves most of their heartbeat messages).
BACKUP_HEARTBEATS = 3


def context(kind: str, acceptor: Node, newcomer: Node) -> bytes:
    """What an acceptance proof is bound to: who accepted whom, and how."""
    return msgpack.packb([kind, *acceptor, *newcomer], use_bin_type=True)


@dataclass
class Stats:
    """Per physical peer counters (events counted once per distinct ciphertext)."""

    received: int = 0
    delivered: int = 0
    false_positives: int = 0
    duplicates: int = 0
    forwarded: int = 0
    dropped: int = 0
    #: ``dropped`` by reason: ``not_from_parent``, ``undecodable``, ``unverified``,
    #: ``digest_from_non_backup``, ``digest_malformed``, ``digest_too_soon``,
    #: ``pull_from_non_watcher``.
    dropped_by: Counter[str] = field(default_factory=Counter)
    #: Events that decrypted and matched but failed the publisher's signature.
    forged: int = 0
    #: Parents taken for failed after falling silent (a link that broke under a peer).
    parents_lost: int = 0
    #: Events dropped (among the duplicates) because one of the same id was delivered before:
    #: a publisher that re-used ids.
    repeated_ids: int = 0
    #: Event ids pulled from backups, and pulled ids a backup refused (not offered, served
    #: already, or forgotten).
    pulled: int = 0
    pulls_refused: int = 0
    #: Events listed in digests, and digest entries tested against this peer's own tokens.
    listed: int = 0
    entries_tested: int = 0

    def drop(self, reason: str) -> None:
        """Count one refused event message (or digest, or pull) under ``reason``."""
        self.dropped += 1
        self.dropped_by[reason] += 1


@dataclass(frozen=True)
class _Admission:
    """A connection request this peer opened, with what it needs to adopt the requester:
    the SW of the entry that opened (None at a root, which proves by signature) and the
    requester's position, which only an opener learns."""

    request: Any
    sw: bytes | None
    position: int


@dataclass
class _Opened:
    """A request this peer opened (kept so a swap handover can accept the newcomer)."""

    vp: str
    newcomer: Node
    admission: _Admission


@dataclass
class _Search:
    """A first join this full peer passed down to the children that may cover its newcomer.
    When every one of them answers :class:`JoinMiss`, the search has failed below this
    peer: it reports the miss to ``upstream`` (the parent that passed the join down to it)
    or, at the top of the search, has the deepest peer that may split take the newcomer."""

    join: Join
    waiting: set[Node]
    upstream: Node | None
    started: float
    admission: _Admission
    #: The deepest peer below that may split for the newcomer, with its depth.
    splitter: tuple[int, Node] | None = None


class PeerMachine:
    """One physical peer: its virtual peers, its keys, its duplicate memories."""

    def __init__(self, address: str, crypto: CryptoSuite, config: OverlayConfig,
                 rng: random.Random, kit: SubscriberKit | None = None,
                 roots: Sequence[RootKit] = ()) -> None:
        self.address = address
        self.crypto = crypto
        self.config = config
        self.rng = rng
        self.kits: dict[int, SubscriberKit] = {}
        self.vpeers: dict[str, VirtualPeer] = {}
        self.contacts: dict[str, list[str]] = {}
        #: Contacts whose join went unanswered -> until when others are tried first.
        self._silent: dict[str, float] = {}
        self.stats = Stats()
        self.stopped = False
        #: No :meth:`tick` before this time has anything to do (a heartbeat, failure timeout,
        #: join retry or key expiry falls due then), so a driver may skip ticks until it.
        self.next_tick_at = 0.0
        self._expiry: dict[int, float] = {}
        cap = config.dedup_capacity
        self._seen_joins: Bounded[tuple[str, bytes], None] = Bounded(cap)
        self._opened: Bounded[bytes, _Opened] = Bounded(cap)
        self._searches: Bounded[tuple[str, bytes], _Search] = Bounded(cap)
        self._seen_events: Bounded[tuple[str, bytes], None] = Bounded(cap)
        self._processed: Bounded[bytes, None] = Bounded(cap)
        self._delivered: Bounded[str, None] = Bounded(cap)
        self._verified: Bounded[bytes, None] = Bounded(cap)
        # One decode per event and one route test per (event, token) on this peer, however
        # many of its virtual peers and children see them.
        self._events: Bounded[bytes, Any] = Bounded(64)
        self._routes: Bounded[tuple[bytes, bytes], bool] = Bounded(cap)
        self._tokens: dict[tuple[str, int], Any] = {}
        #: Ciphertexts of recent events by id: what a backup serves pulls from.
        self._raw: Bounded[bytes, bytes] = Bounded(config.repair_memory)
        #: creator virtual peer id -> its relays, breadth first (see :meth:`_relays`)
        self._relay_lists: dict[str, list[VirtualPeer]] = {}
        for root in roots:
            vp = self._new_vpeer(root.attribute, root.credential,
                                 "." + self.rng.randbytes(6).hex())  # first in the order
            vp.roots[root.epoch] = root
        if kit is not None:
            self._install_kit(kit)
        self._handlers: dict[type[Message], Callable[..., list[Action]]] = {
            Join: self._on_join, JoinMiss: self._on_join_miss, JoinSplit: self._on_join_split,
            Recruit: self._on_recruit, Accept: self._on_accept,
            Detach: self._on_detach, SwapOffer: self._on_swap_offer,
            SwapAccept: self._on_swap_accept, SwapHandover: self._on_swap_handover,
            Tokens: self._on_tokens, Ping: self._on_ping,
            Pong: self._on_pong, Handover: self._on_handover, Publish: self._on_publish,
            Watch: self._on_watch, Digest: self._on_digest, Pull: self._on_pull}

    # -- set-up and user operations -----------------------------------------------------------

    def _new_vpeer(self, attribute: str, credential: Any, vp_id: str | None = None
                   ) -> VirtualPeer:
        vp = VirtualPeer(vp=vp_id or self.rng.randbytes(6).hex(), attribute=attribute,
                         credential=credential, tested=Bounded(self.config.repair_memory))
        self.vpeers[vp.vp] = vp
        return vp

    def _install_kit(self, kit: SubscriberKit) -> list[VirtualPeer]:
        """Add a kit's keys to the matching virtual peers; returns the ones it created."""
        self.kits[kit.epoch] = kit
        created = []
        for keys in kit.virtuals:
            mine = [v for v in self.vpeers.values()
                    if not v.is_root and v.credential == keys.credential]
            if not mine:
                mine = [self._new_vpeer(keys.credential.attribute, keys.credential)]
                created += mine
            for vp in mine:
                vp.keys[kit.epoch] = keys
        return created

    @property
    def epochs(self) -> set[int]:
        """Epochs whose connection requests and events this peer accepts."""
        found = set(self.kits)
        for vp in self.vpeers.values():
            if not vp.relay:  # a relay holds its creator's root material
                found.update(vp.roots)
        return found

    @property
    def epoch(self) -> int:
        return max(self.epochs, default=0)

    def answered_recently(self, attribute: str, now: float) -> list[str]:
        """Other peers of ``attribute``'s tree heard from within the failure timeout: the
        neighbours this peer can vouch for in the directory, so newcomers try live contacts
        before addresses that nobody has seen answer."""
        heard = set()
        for vp in self.vpeers.values():
            if vp.attribute == attribute:
                links = [*vp.parents.items(), *vp.children.items()]
                heard.update(node[0] for node, link in links
                             if now - link.last_heard <= self.config.failure_timeout)
        heard.discard(self.address)
        return sorted(heard)

    def join(self, contacts: Mapping[str, Sequence[str]], now: float) -> list[Action]:
        """Connect every subscriber virtual peer to its tree through one of ``contacts``
        (addresses of peers of the tree, e.g. its root, per attribute)."""
        self.contacts = {a: [c for c in cs if c != self.address] for a, cs in contacts.items()}
        out: list[Action] = []
        for vp in self.vpeers.values():
            if not vp.is_root and not vp.parents:
                vp.join_started = now
                out += self._send_join(vp, now)
        return out

    def publish(self, event: bytes, roots: Mapping[str, str], now: float) -> list[Action]:
        """Send an encrypted event to the root of every attribute tree."""
        return [Send(addr, Publish("", "", attribute, event)) for attribute, addr in roots.items()]

    def leave(self, now: float) -> list[Action]:
        """Leave gracefully: hand the children to a parent, drop the parent links."""
        out: list[Action] = []
        for vp in self.vpeers.values():
            heir = next(iter(self._creator(vp).parents), ("", ""))  # a peer that stays
            for child in vp.children:
                out.append(Send(child[0], Handover(vp.vp, child[1], heir[0], heir[1])))
            for parent in (*vp.parents, *vp.backups):
                out.append(Send(parent[0], Detach(vp.vp, parent[1])))
            vp.children.clear()
            vp.parents.clear()
            vp.backups.clear()
            vp.watchers.clear()
        self._relay_lists.clear()
        self.stopped = True
        self.next_tick_at = float("inf")
        return out

    def rekey(self, now: float, kit: SubscriberKit | None = None,
              roots: Sequence[RootKit] = ()) -> list[Action]:
        """Install the keys of a new epoch; the older epochs stay valid for the grace period."""
        out: list[Action] = []
        for old in self.epochs:
            self._expiry.setdefault(old, now + self.config.grace)
        self._due(now + self.config.grace)
        for root in roots:
            for vp in self.vpeers.values():
                if vp.is_root and vp.attribute == root.attribute:
                    vp.roots[root.epoch] = root
        if kit is not None:
            for vp in self._install_kit(kit):
                vp.join_started = now
                out += self._send_join(vp, now)
        for vp in self.vpeers.values():
            out += self._assign_tokens(vp)
        return out

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Heartbeats, failure detection, join retries, expiry of old epochs."""
        if self.stopped:
            return []
        out: list[Action] = []
        for epoch, until in list(self._expiry.items()):
            if now >= until and epoch != self.epoch:
                self._drop_epoch(epoch)
                out.append(Log("info", f"keys of epoch {epoch} expired"))
        cfg = self.config
        # Links inside this peer (to and from its relays) cannot fail apart: no heartbeats.
        for vp in self.vpeers.values():
            for child, link in list(vp.children.items()):
                if child[0] != self.address and now - link.last_heard > cfg.failure_timeout:
                    del vp.children[child]
                    out.append(Log("info", f"{vp.vp}: child {child[0]} silent, dropped"))
            out += self._tick_watchers(vp, now)
            if vp.is_top:
                continue
            out += self._tick_backups(vp, now)
            remote = [p for p in vp.parents if p[0] != self.address]
            lost = [p for p in remote if now - vp.parents[p].last_heard > cfg.failure_timeout]
            for parent in lost:
                self.stats.parents_lost += 1
                out.append(Log("info", f"{vp.vp}: parent {parent[0]} silent, rejoining"))
                out += self._lose_parent(vp, parent, now)
            if now >= vp.next_ping_at and (remote or vp.backups):
                vp.next_ping_at = now + cfg.heartbeat_interval
                vp.pings += 1
                backups = list(vp.backups) if vp.pings % BACKUP_HEARTBEATS == 0 else []
                pinged = dict.fromkeys([*remote, *backups])  # a parent may be a backup
                out += [Send(p[0], Ping(vp.vp, p[1])) for p in pinged]
            if vp.recruits_left and remote and now >= vp.next_recruit_at:
                out += self._recruit(vp, remote[0], now)
            for join_id, pending in list(vp.joins.items()):
                if (pending.contact and not pending.answered
                        and now - pending.sent_at >= cfg.join_timeout):
                    self._silent[pending.contact] = now + cfg.silent_contact_period
                    pending.contact = ""  # once per join
                if now - pending.sent_at > 2 * cfg.join_timeout:
                    del vp.joins[join_id]
            joining = vp.join_started is not None or vp.parents
            if joining and len(vp.parents) < self._wanted_links(vp) and now >= vp.next_join_at:
                if vp.parents and vp.link_attempts >= cfg.mcr_link_attempts:
                    continue
                # A retry asks the full peer where its search ends to split; one that keeps
                # failing asks the full peer a swap offer named to split right away.
                hint, vp.split_hint = vp.split_hint, None
                retry = any(p.sent_at < now for p in vp.joins.values())
                stuck = (vp.join_started is not None
                         and now - vp.join_started > 2 * cfg.join_timeout)
                target = hint[1] if hint and stuck and not vp.parents else None
                out += self._send_join(vp, now, target, retry)
        self.next_tick_at = self.deadline()
        return out

    def deadline(self) -> float:
        """The earliest time a condition :meth:`tick` checks can hold, from scratch."""
        cfg = self.config
        times = [t for e, t in self._expiry.items() if e != self.epoch]
        for vp in self.vpeers.values():
            times += [c.last_heard + cfg.failure_timeout for n, c in vp.children.items()
                      if n[0] != self.address]
            times += [w.last_heard + self._backup_timeout for w in vp.watchers.values()]
            ready = self._digests_due(vp)
            if ready is not None:
                times.append(ready)
            if vp.is_top:
                continue
            remote = [p for n, p in vp.parents.items() if n[0] != self.address]
            times += [p.last_heard + cfg.failure_timeout for p in remote]
            times += [b.last_heard + self._backup_timeout for b in vp.backups.values()]
            times += [j.sent_at + 2 * cfg.join_timeout for j in vp.joins.values()]
            times += [asked + 2 * cfg.join_timeout for _, asked in vp.watch_asks.values()]
            if remote or vp.backups:
                times.append(vp.next_ping_at)
            if remote and vp.recruits_left:
                times.append(vp.next_recruit_at)
            if ((vp.join_started is not None or vp.parents)
                    and len(vp.parents) < self._wanted_links(vp)
                    and not (vp.parents and vp.link_attempts >= cfg.mcr_link_attempts)):
                times.append(vp.next_join_at)
        return min(times, default=float("inf"))

    def _due(self, at: float) -> None:
        """Something :meth:`tick` checks may fall due at ``at``."""
        self.next_tick_at = min(self.next_tick_at, at)

    def _drop_epoch(self, epoch: int) -> None:
        self.crypto.drop_epoch(epoch)
        self.kits.pop(epoch, None)
        self._tokens = {k: t for k, t in self._tokens.items() if k[1] != epoch}
        self._expiry.pop(epoch, None)
        for vp in self.vpeers.values():
            vp.keys.pop(epoch, None)
            vp.roots.pop(epoch, None)

    # -- joining -----------------------------------------------------------------------------

    def _wanted_links(self, vp: VirtualPeer) -> int:
        if vp.is_top:
            return 0
        if vp.relay or self.config.routing == "ohf":
            return 1
        keys = vp.keys.get(self.epoch)
        return max(1, len(keys.fine_tokens)) if keys else 1

    def _send_join(self, vp: VirtualPeer, now: float, target: Node | None = None,
                   split: bool = False) -> list[Action]:
        keys = vp.keys.get(self.epoch)
        if keys is None:
            return [Log("warning", f"{vp.vp}: no keys for epoch {self.epoch}, cannot join")]
        contact = ""
        if target is None:
            candidates = self.contacts.get(vp.attribute, [])
            if not candidates:
                return [Log("warning", f"{vp.vp}: no contact for tree {vp.attribute!r}")]
            answering = [c for c in candidates if self._silent.get(c, 0.0) <= now]
            contact = self.rng.choice(answering or candidates)
            target = (contact, "")
        join_id = self.rng.randbytes(16)
        vp.joins[join_id] = PendingJoin(now, self.epoch, contact=contact)
        vp.next_join_at = now + self.config.join_timeout
        self._due(vp.next_join_at)
        if vp.parents:
            vp.link_attempts += 1
        return [Send(target[0], Join(vp.vp, target[1], vp.attribute, join_id, self.address,
                                     vp.vp, self.config.hop_limit, keys.request, split,
                                     _depth(vp)))]

    def _lose_parent(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        vp.parents.pop(parent, None)
        vp.assignment.pop(parent, None)
        vp.link_attempts = 0
        if vp.parents:
            return self._assign_tokens(vp)
        vp.join_started = now
        vp.next_join_at = now
        self._due(now)
        return []

    def _check_request(self, data: bytes, attribute: str, now: float) -> tuple[Any, str | None]:
        try:
            request = self.crypto.decode_request(data)
            if self.crypto.request_attribute(request) != attribute:
                raise CryptoRejected("connection request is for another tree")
            self.crypto.check_request(request, now, self.epochs)
        except CryptoRejected as exc:
            return None, str(exc)
        return request, None

    def _open(self, vp: VirtualPeer, request: Any) -> _Admission | None:
        """Open ``request`` with this virtual peer's token of the request's epoch (a root:
        the whole-domain token, which opens every request and proves by signature)."""
        epoch = self.crypto.request_epoch(request)
        holder = vp.roots.get(epoch) if vp.is_root else vp.keys.get(epoch)
        if holder is None:
            return None
        opening = self.crypto.open_request(holder.opener, request)
        if opening is None:
            return None
        return _Admission(request, None if vp.is_root else opening.sw, opening.position)

    def _prove(self, vp: VirtualPeer, admission: _Admission, ctx: bytes) -> tuple[bytes, bytes]:
        """(proof, certificate): HMAC under SW, or the root's signature and certificate."""
        request = admission.request
        if admission.sw is not None:
            return self.crypto.acceptance_proof(admission.sw, request, ctx), b""
        root = vp.roots[max(vp.roots)]
        return self.crypto.root_proof(root, request, ctx), root.certificate

    def _on_join(self, vp: VirtualPeer, frm: Node, m: Join, now: float) -> list[Action]:
        if (vp.vp, m.join_id) in self._seen_joins:
            return []
        if m.origin == self.address:
            # A peer never joins below its own virtual peers: end the search here at once.
            return self._miss(vp, frm, m)
        if m.hops <= 0 or m.attribute != vp.attribute:
            return [Log("debug", f"{vp.vp}: join {m.join_id.hex()[:8]} out of hops or tree")]
        request, error = self._check_request(m.request, vp.attribute, now)
        if error is not None:
            return [Log("warning", f"join from {frm[0]} dropped: {error}")]
        self._seen_joins.put((vp.vp, m.join_id), None)
        newcomer = (m.origin, m.origin_vp)
        admission = self._open(vp, request)
        if admission is None:
            if frm not in vp.parents:
                return self._forward(vp, m, list(vp.parents), [])
            # From the parent (a full peer that covers the newcomer): offer a swap, which
            # only a newcomer that covers this peer (on its first join) can take; on a retry
            # the offer also tells the newcomer where a split may take it (the parent). This
            # peer cannot tell whether the newcomer is coarser: only an opener learns the
            # requester's position, so the newcomer decides by opening this peer's request.
            epoch = self.crypto.request_epoch(request)
            keys = vp.keys.get(epoch)
            if keys is None or m.depth >= 0:
                return self._miss(vp, frm, m)
            vp.swaps[m.join_id] = SwapOffered(frm, newcomer, epoch)
            return [Send(m.origin, SwapOffer(vp.vp, m.origin_vp, m.join_id, keys.request, *frm,
                                             _depth(vp))),
                    *self._miss(vp, frm, m)]
        position = admission.position
        self._opened.put(m.join_id, _Opened(vp.vp, newcomer, admission))
        ups = [p for p in vp.parents if p != frm]
        if not vp.attached or not vp.precedes(position, m.origin_vp):
            # Nobody below this peer may take it either.
            return self._forward(vp, m, ups, []) + self._miss(vp, frm, m)
        fresh = not self._linked(vp, newcomer)
        taken = self._take(vp, newcomer, m.join_id, admission, now) if fresh else None
        if taken is not None:
            return taken
        # Full: search the children that may cover the newcomer and precede it (coarser, or
        # as fine with a smaller id); on a first join ask the finer ones for a swap.
        downs, others = [], []
        for child, link in vp.children.items():
            if child != frm and child[0] != m.origin:
                first = comes_first(link.position, child[1], position, m.origin_vp)
                (downs if first else others).append(child)
        # A retry splits where its search ends, right here if the newcomer was sent here by
        # a swap offer's hint, or at the first full covering peer it climbs to; where no
        # relay may be split off, it climbs on from the peer the relays copy.
        climbed = frm in vp.children and not vp.is_root
        if fresh and m.depth < 0 and (climbed or not downs or (
                m.split and frm == newcomer and m.dst_vp == vp.vp)):
            return self._split_or_climb(vp, m, admission, now)
        # The search stays below the first peer that may take the newcomer, so it costs
        # the covering part of that subtree, not of the whole tree.
        out = self._forward(vp, m, downs, others if m.depth < 0 else [])
        if not downs or m.hops <= 1:
            return out + self._miss(vp, frm, m)
        if fresh and m.depth < 0:
            upstream = frm if frm in vp.parents else None
            self._searches.put((vp.vp, m.join_id),
                               _Search(m, set(downs), upstream, now, admission))
        return out

    def _take(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, admission: _Admission,
              now: float) -> list[Action] | None:
        """Adopt a newcomer not linked to them yet (see :meth:`_linked`) into a free slot of
        ``vp`` or of one of its relays; None when all are full."""
        free = next((r for r in (vp, *self._relays(self._creator(vp)))
                     if len(r.children) < self.config.max_children), None)
        return None if free is None else self._adopt(free, newcomer, join_id, admission, now)

    def _linked(self, vp: VirtualPeer, node: Node) -> bool:
        """Is ``node`` a parent of ``vp``, or a child of it or of one of its relays?"""
        return node in vp.parents or any(node in r.children
                                         for r in (vp, *self._relays(self._creator(vp))))

    def _split_or_climb(self, vp: VirtualPeer, m: Join, admission: _Admission, now: float
                        ) -> list[Action]:
        """Take the newcomer by a split; where no relay may be split off, pass the join on
        from the peer the relays copy."""
        creator = self._creator(vp)
        return (self._split(vp, (m.origin, m.origin_vp), m.join_id, admission, now)
                or self._forward(creator, m, list(creator.parents), []))

    def _miss(self, vp: VirtualPeer, frm: Node, m: Join) -> list[Action]:
        """Tell the parent that passed a join down that it ends here (a swap probe, sent
        with a single hop, is not waited for and gets no answer)."""
        if m.hops <= 1 or frm not in vp.parents:
            return []
        return [Send(frm[0], JoinMiss(vp.vp, frm[1], m.join_id, "", "", -1))]

    def _on_join_miss(self, vp: VirtualPeer, frm: Node, m: JoinMiss, now: float
                      ) -> list[Action]:
        search = self._searches.get((vp.vp, m.join_id))
        if search is None or frm not in search.waiting:
            return [Log("debug", f"{vp.vp}: join miss from {frm[0]} for no search, ignored")]
        search.waiting.discard(frm)
        if m.depth >= 0 and (search.splitter is None or m.depth > search.splitter[0]):
            search.splitter = (m.depth, (m.splitter, m.splitter_vp))
        if search.waiting:
            return []
        self._searches.pop((vp.vp, m.join_id))
        if now - search.started > self.config.join_timeout:
            return []  # the newcomer has retried by now
        join = search.join
        newcomer = (join.origin, join.origin_vp)
        if search.upstream is not None:
            up, best = search.upstream, search.splitter
            if up not in vp.parents:
                return []
            depth = vp.depth
            if (best is None and depth is not None
                    and self._split_host(self._creator(vp), newcomer) is not None):
                best = (depth, (self.address, vp.vp))
            name, depth = (best[1], best[0]) if best else (("", ""), -1)
            return [Send(up[0], JoinMiss(vp.vp, up[1], m.join_id, *name, depth))]
        if self._linked(vp, newcomer):
            return []
        if search.splitter is not None:
            target = search.splitter[1]
            return [Send(target[0], JoinSplit(vp.vp, target[1], m.join_id))]
        return (self._take(vp, newcomer, join.join_id, search.admission, now)
                or self._split_or_climb(vp, join, search.admission, now))

    def _on_join_split(self, vp: VirtualPeer, frm: Node, m: JoinSplit, now: float
                       ) -> list[Action]:
        opened = self._opened.get(m.join_id)
        if opened is None or opened.vp != vp.vp or self._linked(vp, opened.newcomer):
            return [Log("debug", f"{vp.vp}: split request from {frm[0]} for no open join")]
        return (self._take(vp, opened.newcomer, m.join_id, opened.admission, now)
                or self._split(vp, opened.newcomer, m.join_id, opened.admission, now)
                or [Log("debug", f"{vp.vp}: asked to split for {opened.newcomer[0]}, cannot")])

    def _forward(self, vp: VirtualPeer, m: Join, targets: list[Node], swap_probes: list[Node]
                 ) -> list[Action]:
        """Pass a join on to ``targets`` with one hop less; ``swap_probes`` may only answer
        with a swap offer, so they get a single hop."""
        if m.hops <= 1:
            targets = []
        return [Send(n[0], _retarget(m, vp.vp, n[1], m.hops - 1)) for n in targets] + [
            Send(n[0], _retarget(m, vp.vp, n[1], 1)) for n in swap_probes]

    def _adopt(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, admission: _Admission,
               now: float) -> list[Action]:
        vp.children[newcomer] = ChildLink(now, admission.position,
                                          self.crypto.request_nonce(admission.request))
        self._due(now + self.config.failure_timeout)
        proof, cert = self._prove(vp, admission, context("join", (self.address, vp.vp),
                                                         newcomer))
        return [Send(newcomer[0], Accept(vp.vp, newcomer[1], join_id, proof, cert))]

    def _creator(self, vp: VirtualPeer) -> VirtualPeer:
        """The virtual peer a relay is a copy of (itself if it is no relay)."""
        parent = next(iter(vp.parents), ("", ""))
        while vp.relay and parent[0] == self.address:
            vp = self.vpeers[parent[1]]
            parent = next(iter(vp.parents), ("", ""))
        return vp

    def _relays(self, vp: VirtualPeer) -> list[VirtualPeer]:
        """The relays below ``vp``, breadth first (they are all local; only a split adds
        one, so the list is kept until the next split)."""
        queue = self._relay_lists.get(vp.vp)
        if queue is None:
            queue = [self.vpeers[c[1]] for c in vp.children if self._is_relay(c)]
            for relay in queue:
                queue += [self.vpeers[c[1]] for c in relay.children if self._is_relay(c)]
            self._relay_lists[vp.vp] = queue
        return queue

    def _split(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, admission: _Admission,
               now: float) -> list[Action]:
        """A full peer that covers the newcomer but none of whose children may: a relay
        copy of this virtual peer takes the slot of one child (of the peer it copies or of
        its shallowest relay that has one), that child and the newcomer."""
        vp = self._creator(vp)
        host = self._split_host(vp, newcomer)
        if host is None:
            return []
        relay = self._new_vpeer(vp.attribute, vp.credential,
                                f"{host.vp}.{self.rng.randbytes(3).hex()}")
        self._relay_lists.pop(vp.vp, None)
        relay.keys, relay.roots, relay.relay = dict(vp.keys), dict(vp.roots), True
        relay.parents[(self.address, host.vp)] = ParentLink(now, host.depth)
        moved = self.rng.choice(self._movable(host, newcomer))
        relay.children[moved] = host.children.pop(moved)
        host.children[(self.address, relay.vp)] = ChildLink(now, vp.credential.position)
        return [Log("info", f"{vp.vp}: full, split off relay {relay.vp}"),
                Send(moved[0], Handover(host.vp, moved[1], self.address, relay.vp)),
                *self._adopt(relay, newcomer, join_id, admission, now)]

    def _split_host(self, creator: VirtualPeer, newcomer: Node) -> VirtualPeer | None:
        """Where a split of ``creator`` would take a child from, None if it may not split.
        The root takes whoever nobody else covers, so only its relays are unbounded; they
        fill breadth first, which keeps relay chains logarithmic."""
        relays = self._relays(creator)
        if ((not creator.is_top and len(relays) >= self.config.max_relays)
                or self.config.max_children < 2):
            return None
        return next((h for h in (creator, *relays) if self._movable(h, newcomer)), None)

    def _movable(self, host: VirtualPeer, newcomer: Node) -> list[Node]:
        """Children a split may move to the new relay: not relays, not the newcomer."""
        return sorted(c for c in host.children if not self._is_relay(c) and c != newcomer)

    def _proven(self, vp: VirtualPeer, frm: Node, m: Accept, epoch: int, kind: str,
                now: float) -> bool:
        """Did ``frm`` prove it opened this virtual peer's request of ``epoch`` (so its
        credential covers ours), for a link of ``kind``?"""
        keys = vp.keys.get(epoch)
        if keys is None:
            return False
        request = self.crypto.decode_request(keys.request)
        ctx = context(kind, frm, (self.address, vp.vp))
        if m.certificate:
            return self.crypto.check_root_proof(m.certificate, vp.attribute, request, m.proof,
                                                ctx, now)
        return self.crypto.check_acceptance(keys.sws, request, m.proof, ctx)

    def _on_accept(self, vp: VirtualPeer, frm: Node, m: Accept, now: float) -> list[Action]:
        if m.join_id in vp.watch_asks:
            return self._on_watch_accept(vp, frm, m, now)
        pending = vp.joins.get(m.join_id)
        if pending is None or pending.epoch not in vp.keys:
            return [Log("info", f"{vp.vp}: accept from {frm[0]} for no pending join, ignored")]
        if not self._proven(vp, frm, m, pending.epoch, "join", now):
            return [Log("warning", f"{vp.vp}: accept from {frm[0]} with a bad proof dropped")]
        pending.answered = True
        if frm in vp.parents:  # the request reached this parent twice: already linked
            return []
        if (frm[0] == self.address or frm in vp.children
                or len(vp.parents) >= self._wanted_links(vp)):
            return [Send(frm[0], Detach(vp.vp, frm[1]))]
        return self._add_parent(vp, frm, now)

    def _add_parent(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        vp.parents[parent] = ParentLink(now)
        if not vp.relay:
            vp.recruits_left = self.config.recruit_rounds
            vp.next_recruit_at = now + self.config.recruit_interval * (0.5 + self.rng.random())
            self._due(vp.next_recruit_at)
        self._due(min(vp.next_ping_at, now + self.config.failure_timeout))
        started = vp.join_started if vp.join_started is not None else now
        if len(vp.parents) >= self._wanted_links(vp):
            vp.join_started = None
        out: list[Action] = [Connected(vp.attribute, vp.vp, parent[0], len(vp.parents),
                                       started, now)]
        return out + self._assign_tokens(vp)

    def _assign_tokens(self, vp: VirtualPeer) -> list[Action]:
        """MCR: deal the fine credentials' tokens (of every valid epoch, a credential's
        tokens together) evenly over the parents, so with enough parents each goes to a
        different parent. The deal is stable: a token stays with the parent that has it
        while that parent stays and is not over its share, because every move opens a
        window in which an event in flight meets neither its old nor its new route."""
        if self.config.routing != "mcr" or vp.relay or vp.is_root or not vp.parents:
            return []
        parents = list(vp.parents)
        fine: dict[int, list[bytes]] = {}
        for epoch in sorted(vp.keys):
            keys = vp.keys[epoch]
            for i, token in enumerate(keys.fine_tokens or (keys.token,)):
                fine.setdefault(i, []).append(token)
        holder = {t: p for p, tokens in vp.assignment.items() if p in vp.parents
                  for t in tokens}
        share = -(-len(fine) // len(parents))
        dealt: dict[Node, list[bytes]] = {p: [] for p in parents}
        load = dict.fromkeys(parents, 0)
        moving = []
        for tokens in fine.values():
            kept = next((holder[t] for t in tokens if t in holder), None)
            if kept is None or load[kept] >= share:
                moving.append(tokens)
                continue
            dealt[kept] += tokens
            load[kept] += 1
        for tokens in moving:
            least = min(parents, key=load.__getitem__)
            dealt[least] += tokens
            load[least] += 1
        out: list[Action] = []
        for p in parents:
            tokens = tuple(sorted(dealt[p]))
            if vp.assignment.get(p) != tokens:
                vp.assignment[p] = tokens
                out.append(Send(p[0], Tokens(vp.vp, p[1], tokens)))
        return out

    # -- swaps (Algorithm 2, line 9) -----------------------------------------------------------

    def _recruit(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        vp.recruits_left -= 1
        vp.next_recruit_at = now + self.config.recruit_interval
        self._due(vp.next_recruit_at)
        keys = vp.keys.get(self.epoch)
        if keys is None or len(vp.children) >= self.config.max_children:
            return []
        join_id = self.rng.randbytes(16)
        vp.joins[join_id] = PendingJoin(now, self.epoch, recruit=True)
        return [Send(parent[0], Recruit(vp.vp, parent[1], join_id, keys.request))]

    def _on_recruit(self, vp: VirtualPeer, frm: Node, m: Recruit, now: float
                    ) -> list[Action]:
        """Pass a child's request to a sample of this peer's (and its relays') children
        that are finer than it, as single-hop swap probes that seem to come from their
        own parent."""
        link = vp.children.get(frm)
        if link is None:
            return [Log("info", f"{vp.vp}: recruit from non-child {frm[0]} ignored")]
        request, error = self._check_request(m.request, vp.attribute, now)
        if error is not None or self.crypto.request_nonce(request) != link.nonce:
            return [Log("warning", f"{vp.vp}: recruit from {frm[0]} dropped: "
                                   f"{error or 'not the request it joined with'}")]
        creator = self._creator(vp)
        finer = [(host, c) for host in (creator, *self._relays(creator))
                 for c, other in host.children.items()
                 if c != frm and c[0] != frm[0] and other.position > link.position
                 and not self._is_relay(c)]
        probes = self.rng.sample(finer, min(self.config.recruit_sample, len(finer)))
        return [Send(c[0], Join(host.vp, c[1], vp.attribute, m.join_id, frm[0], frm[1], 1,
                                m.request, False, -1)) for host, c in probes]

    def _on_swap_offer(self, vp: VirtualPeer, frm: Node, m: SwapOffer, now: float
                       ) -> list[Action]:
        pending = vp.joins.get(m.join_id)
        if (pending is None or (vp.parents and not pending.recruit)
                or frm in vp.children or frm in vp.parents):
            return [Log("debug", f"{vp.vp}: swap offer from {frm[0]} not wanted")]
        request, error = self._check_request(m.request, vp.attribute, now)
        if error is not None:
            return [Log("warning", f"swap offer from {frm[0]} dropped: {error}")]
        pending.answered = True
        admission = self._open(vp, request)
        if (admission is None or admission.sw is None
                or len(vp.children) >= self.config.max_children
                or not vp.precedes(admission.position, frm[1])):
            # The offerer's parent covers this peer and is full: a retry may split there;
            # the deepest offerer's parent is the deepest such peer.
            if not pending.recruit and (vp.split_hint is None or m.depth > vp.split_hint[0]):
                vp.split_hint = (m.depth, (m.parent, m.parent_vp))
            return [Log("debug", f"{vp.vp}: swap offer from {frm[0]} not taken")]
        vp.children[frm] = ChildLink(now, admission.position,
                                     self.crypto.request_nonce(request))
        self._due(now + self.config.failure_timeout)
        proof = self.crypto.acceptance_proof(admission.sw, request,
                                             context("swap", (self.address, vp.vp), frm))
        return [Send(frm[0], SwapAccept(vp.vp, frm[1], m.join_id, proof))]

    def _on_swap_accept(self, vp: VirtualPeer, frm: Node, m: SwapAccept, now: float
                        ) -> list[Action]:
        offer = vp.swaps.get(m.join_id)
        keys = vp.keys.get(offer.epoch) if offer else None
        if offer is None or keys is None or offer.newcomer != frm:
            return [Log("info", f"{vp.vp}: swap accept from {frm[0]} for no offer, ignored")]
        request = self.crypto.decode_request(keys.request)
        if not self.crypto.check_acceptance(keys.sws, request, m.proof,
                                            context("swap", frm, (self.address, vp.vp))):
            return [Log("warning", f"{vp.vp}: swap accept from {frm[0]} with a bad proof")]
        del vp.swaps[m.join_id]
        if offer.old_parent not in vp.parents:
            return [Log("info", f"{vp.vp}: swap with {frm[0]} is stale, declined"),
                    Send(frm[0], Detach(vp.vp, frm[1]))]
        vp.parents.pop(offer.old_parent)
        vp.assignment.pop(offer.old_parent, None)
        vp.former = {a: t for a, t in vp.former.items() if t >= now}
        # The old parent forwards for failure_timeout after the handover reaches it.
        vp.former[offer.old_parent[0]] = now + 2 * self.config.failure_timeout
        out: list[Action] = [Send(offer.old_parent[0], SwapHandover(vp.vp, offer.old_parent[1],
                                                                    m.join_id))]
        if frm in vp.parents:
            return out + self._assign_tokens(vp)
        return out + self._add_parent(vp, frm, now)

    def _on_swap_handover(self, vp: VirtualPeer, frm: Node, m: SwapHandover, now: float
                          ) -> list[Action]:
        if frm not in vp.children:
            return [Log("info", f"{vp.vp}: swap handover from non-child {frm[0]} ignored")]
        # The child's new parent may have passed on an event before adopting it, which only
        # reaches this peer now: keep forwarding to the child for a while (it takes events
        # from a former parent that long, see _on_swap_accept).
        vp.released = {n: r for n, r in vp.released.items() if r[1] > now}
        vp.released[frm] = (vp.children.pop(frm), now + self.config.failure_timeout)
        opened = self._opened.get(m.join_id)
        if (opened is None or opened.vp != vp.vp or opened.newcomer in vp.children
                or not vp.attached or not vp.precedes(opened.admission.position,
                                                      opened.newcomer[1])):
            return [Log("debug", f"{vp.vp}: {frm[0]} swapped away, its newcomer not taken")]
        return self._adopt(vp, opened.newcomer, m.join_id, opened.admission, now)

    # -- links -------------------------------------------------------------------------------

    def _on_detach(self, vp: VirtualPeer, frm: Node, m: Detach, now: float) -> list[Action]:
        if vp.children.pop(frm, None) is None and vp.watchers.pop(frm, None) is None:
            return [Log("debug", f"{vp.vp}: detach from non-child {frm[0]} ignored")]
        return []

    def link_holder(self, vp: VirtualPeer, child: Node) -> VirtualPeer | None:
        """The virtual peer that holds the link to ``child``: ``vp`` or, after a split moved
        the child, the relay of ``vp``'s family that took it (the child may still address
        ``vp`` until the handover reaches it)."""
        creator = self._creator(vp)
        return next((r for r in (vp, creator, *self._relays(creator)) if child in r.children),
                    None)

    def _on_tokens(self, vp: VirtualPeer, frm: Node, m: Tokens, now: float) -> list[Action]:
        # Tokens sent before a split's handover reached the child belong to the link
        # wherever it is now.
        holder = self.link_holder(vp, frm)
        if holder is None:
            return [Log("info", f"{vp.vp}: tokens from non-child {frm[0]} ignored")]
        try:
            tokens = {t: self.crypto.decode_token(t) for t in m.tokens}
        except CryptoRejected as exc:
            return [Log("warning", f"{vp.vp}: tokens from {frm[0]} dropped: {exc}")]
        # Make before break: a token this update takes away goes on routing here for a
        # while, since the parent that takes it over may already have passed on an event
        # that only reaches this peer now.
        link = holder.children[frm]
        still = link.withdrawn if now < link.withdrawn_until else {}
        link.withdrawn = {r: t for r, t in {**still, **link.tokens}.items() if r not in tokens}
        link.withdrawn_until = now + self.config.failure_timeout
        link.tokens = tokens
        return []

    def _on_ping(self, vp: VirtualPeer, frm: Node, m: Ping, now: float) -> list[Action]:
        # A ping sent before a split's handover reached the child keeps the link alive where
        # it is now, and the pong comes from there: with a slow uplink, every ping in flight
        # during the handover would otherwise count for nothing, and the relay would drop
        # the child as silent while the child takes the relay's silence for a failure.
        # A watcher's ping keeps its backup link alive and is answered from the virtual
        # peer it pinged, which it knows as its backup (it may be a relay's child too).
        holder = self.link_holder(vp, frm) or vp
        watcher = vp.watchers.get(frm)
        links = [x for x in (holder.children.get(frm), watcher) if x is not None]
        for link in links:
            link.last_heard = now
        src = vp if watcher is not None else holder
        return [Send(frm[0], Pong(src.vp, frm[1], bool(links), _depth(src),
                                  *(self._ancestor(src) if links else ("", ""))))]

    def _on_pong(self, vp: VirtualPeer, frm: Node, m: Pong, now: float) -> list[Action]:
        """A parent's or backup's answer; either may name an ancestor to ask for backup."""
        link, backup = vp.parents.get(frm), vp.backups.get(frm)
        if link is None and backup is None:
            return [Log("debug", f"{vp.vp}: pong from non-parent {frm[0]} ignored")]
        if not m.ok:
            vp.backups.pop(frm, None)
            if link is None:
                return [Log("info", f"{vp.vp}: backup {frm[0]} dropped us")]
            return [Log("info", f"{vp.vp}: parent {frm[0]} dropped us, rejoining"),
                    *self._lose_parent(vp, frm, now)]
        for heard in (link, backup):
            if heard is not None:
                heard.last_heard = now
        if link is not None:
            link.depth = None if m.depth < 0 else m.depth
        return self._ask_backup(vp, (m.ancestor, m.ancestor_vp), now)

    def _on_handover(self, vp: VirtualPeer, frm: Node, m: Handover, now: float
                     ) -> list[Action]:
        if frm not in vp.parents:
            return [Log("info", f"{vp.vp}: handover from non-parent {frm[0]} ignored")]
        if m.new_parent == frm[0] and m.new_parent_vp:
            # A split moved this child to a relay of the same peer (a copy of the parent,
            # already holding the link): take the new parent over, no rejoin, no gap.
            parent = (m.new_parent, m.new_parent_vp)
            if parent in vp.parents:  # MCR: already linked to that relay too
                return self._lose_parent(vp, frm, now)
            vp.parents[parent] = vp.parents.pop(frm)
            if frm in vp.assignment:
                vp.assignment[parent] = vp.assignment.pop(frm)
            return []
        out = self._lose_parent(vp, frm, now)
        target = (m.new_parent, m.new_parent_vp) if m.new_parent else None
        return out + self._send_join(vp, now, target)

    # -- events ------------------------------------------------------------------------------

    def _on_publish(self, vp: VirtualPeer, frm: Node, m: Publish, now: float) -> list[Action]:
        # Any virtual peer of a parent's peer may send: a relay that a split just moved
        # this child to forwards before the handover arrives. A backup may send only what
        # this peer pulled from it.
        digest = _event_id(m.event)
        backup = vp.backups.get(frm)
        pulled = backup is not None and digest in backup.pulled
        if pulled:
            backup.pulled.pop(digest)
        from_parent = (pulled or any(frm[0] == p[0] for p in vp.parents)
                       or vp.former.get(frm[0], -1.0) >= now)
        if (not vp.is_root and not from_parent) or m.attribute != vp.attribute:
            self.stats.drop("not_from_parent")
            return [Log("info", f"{vp.vp}: event from non-parent {frm[0]} or tree dropped")]
        return self._take_event(vp, frm[0], digest, m.event, now)

    def _take_event(self, vp: VirtualPeer, source: str, digest: bytes, data: bytes,
                    now: float) -> list[Action]:
        """An event for ``vp`` (from a parent, a pull, or another tree of this peer): check
        it, forward it down, list it for the peers ``vp`` backs up, and consume it."""
        if (vp.vp, digest) in self._seen_events:
            return []
        event = self._events.get(digest)
        if event is None:
            try:
                event = self.crypto.decode_event(data)
            except CryptoRejected as exc:
                self.stats.drop("undecodable")
                return [Log("warning", f"{vp.vp}: event from {source} dropped: {exc}")]
            self._events.put(digest, event)
        if self.config.verify_before_forward and not self._verify(digest, event):
            self.stats.drop("unverified")
            return [Log("warning", f"{vp.vp}: event from {source} fails verification")]
        self._seen_events.put((vp.vp, digest), None)
        self._raw.put(digest, data)
        out: list[Action] = []
        for child in self._route(vp, digest, event, now):
            out.append(Send(child[0], Publish(vp.vp, child[1], vp.attribute, data)))
        self.stats.forwarded += len(out)
        self._list_for_watchers(vp, digest, event, now)
        if not vp.is_root:
            out += self._consume(digest, event, now)
        return out

    def _route(self, vp: VirtualPeer, digest: bytes, event: Any, now: float
               ) -> Iterable[Node]:
        """OHF: every child if this peer's own token matches (roots: always);
        MCR: each child one of whose tokens (or tokens withdrawn a moment ago) matches, and,
        like OHF, each child whose tokens of the event's epoch have not arrived yet (just
        attached, or just re-keyed). Children released by a swap a moment ago count too."""
        vp.released = {n: r for n, r in vp.released.items() if r[1] > now}
        links = [*vp.children.items(),
                 *((n, r[0]) for n, r in vp.released.items() if n not in vp.children)]
        epoch = self.crypto.event_epoch(event)
        if self.config.routing == "mcr":
            out = []
            for child, link in links:
                withdrawn = link.withdrawn if now < link.withdrawn_until else {}
                current = {r: t for r, t in link.tokens.items()
                           if self.crypto.token_epoch(t) == epoch}
                routing = {r: t for r, t in withdrawn.items()
                           if self.crypto.token_epoch(t) == epoch} | current
                if self._is_relay(child) or not current or any(
                        self._routes_to(digest, event, raw, t) for raw, t in routing.items()):
                    out.append(child)
            return out
        if not links:
            return []
        if not vp.is_root:
            token = self._own_token(vp, epoch)
            if token is None or not self.crypto.route(token, event):
                return []
        return [child for child, _ in links]

    def _routes_to(self, digest: bytes, event: Any, raw: bytes, token: Any) -> bool:
        known = self._routes.get((digest, raw))
        if known is None:
            known = self.crypto.route(token, event)
            self._routes.put((digest, raw), known)
        return known

    def _is_relay(self, node: Node) -> bool:
        """Relays are this peer's own copies: they get whatever their parent got."""
        relay = self.vpeers.get(node[1]) if node[0] == self.address else None
        return relay is not None and relay.relay

    def _own_token(self, vp: VirtualPeer, epoch: int) -> Any:
        token = self._tokens.get((vp.vp, epoch))
        if token is None and epoch in vp.keys:
            token = self._tokens[(vp.vp, epoch)] = self.crypto.decode_token(vp.keys[epoch].token)
        return token

    def _verify(self, digest: bytes, event: Any) -> bool:
        if digest in self._verified:
            return True
        if not self.crypto.verify(event):
            return False  # forged: remember nothing
        self._verified.put(digest, None)
        return True

    def _consume(self, digest: bytes, event: Any, now: float) -> list[Action]:
        """Local delivery: once per ciphertext; decrypt, check the exact predicate, and
        verify only what would be delivered. Decryption is public-key (anyone can encrypt),
        so nothing is delivered unverified; but a false positive, the common case under
        OHF, costs no verification."""
        if digest in self._processed:
            self.stats.duplicates += 1
            return []
        kit = self.kits.get(self.crypto.event_epoch(event))
        if kit is None:
            return [Log("info", "event of an epoch this peer has no keys for")]
        self._processed.put(digest, None)
        self.stats.received += 1
        plain = self.crypto.decrypt(kit.decrypt_key, event)
        if plain is None or not kit.predicate.matches(plain.values):
            self.stats.false_positives += 1
            return []
        if not self._verify(digest, event):
            self.stats.forged += 1
            return [Log("warning", "event fails verification, not delivered")]
        if plain.event_id in self._delivered:
            self.stats.duplicates += 1
            self.stats.repeated_ids += 1
            return [Log("info", f"dropped event {plain.event_id!r}: an event of this id was "
                        f"delivered before ({self.stats.repeated_ids} dropped so far)")]
        self._delivered.put(plain.event_id, None)
        self.stats.delivered += 1
        return [Deliver(plain, now)]

    # -- repair: backups, digests and pulls ---------------------------------------------------

    @property
    def _backup_timeout(self) -> float:
        """Backups are pinged every ``BACKUP_HEARTBEATS``-th heartbeat, so a backup link is
        taken for failed after that many failure timeouts."""
        return BACKUP_HEARTBEATS * self.config.failure_timeout

    def _ancestor(self, vp: VirtualPeer) -> Node:
        """The nearest remote parent of this virtual peer (of the one it copies, for a
        relay): what a child may ask to be its backup. ("", "") for the tree's top."""
        creator = self._creator(vp)
        return next((p for p in creator.parents if p[0] != self.address), ("", ""))

    def _ask_backup(self, vp: VirtualPeer, ancestor: Node, now: float) -> list[Action]:
        """Ask an ancestor a parent or backup named to back this virtual peer up, if it
        needs one more. Under OHF never a peer that is a parent of it: a backup can learn
        the exact credential (see ``OverlayConfig.repairs``), which an OHF parent does not
        know; an MCR parent knows it from the fine tokens, and may be a parent for some of
        them and a backup for those a dropping parent withholds."""
        if (not self.config.repairs or vp.relay or not ancestor[0]
                or len(vp.backups) + len(vp.watch_asks) >= self.config.backups):
            return []
        keys = vp.keys.get(self.epoch)
        linked = {self.address, *(n[0] for n in vp.backups), *self._parent_peers(vp),
                  *(n[0] for n, _ in vp.watch_asks.values())}
        if keys is None or ancestor[0] in linked:
            return []
        join_id = self.rng.randbytes(16)
        vp.watch_asks[join_id] = (ancestor, now)
        self._due(now + 2 * self.config.join_timeout)
        return [Send(ancestor[0], Watch(vp.vp, ancestor[1], join_id, keys.request))]

    def _on_watch(self, vp: VirtualPeer, frm: Node, m: Watch, now: float) -> list[Action]:
        """Back up a virtual peer this one covers and precedes (it opens its request) and
        prove it, as an acceptance does; at most ``max_watchers`` of them, at most
        ``max_watchers_per_peer`` from one physical peer and one per request."""
        if frm[0] == self.address:
            return [Log("info", f"{vp.vp}: watch from its own peer ignored")]
        same_peer = [link for node, link in vp.watchers.items()
                     if node[0] == frm[0] and node != frm]
        if frm not in vp.watchers and (len(vp.watchers) >= self.config.max_watchers or
                                       len(same_peer) >= self.config.max_watchers_per_peer):
            return [Log("info", f"{vp.vp}: watch from {frm[0]} refused: watchers full")]
        request, error = self._check_request(m.request, vp.attribute, now)
        admission = self._open(vp, request) if error is None else None
        if admission is None or not vp.precedes(admission.position, frm[1]):
            return [Log("warning", f"{vp.vp}: watch from {frm[0]} refused: "
                                   f"{error or 'does not cover or precede it'}")]
        nonce = self.crypto.request_nonce(admission.request)
        if any(link.nonce == nonce for link in same_peer):
            return [Log("warning", f"{vp.vp}: watch from {frm[0]} refused: its request "
                                   "already has a watcher link")]
        if frm not in vp.watchers:
            vp.watchers[frm] = WatchLink(now, admission.position, nonce,
                                         offered=Bounded(self.config.repair_memory))
        self._due(now + self._backup_timeout)
        proof, cert = self._prove(vp, admission, context("watch", (self.address, vp.vp), frm))
        return [Send(frm[0], Accept(vp.vp, frm[1], m.join_id, proof, cert))]

    def _on_watch_accept(self, vp: VirtualPeer, frm: Node, m: Accept, now: float
                         ) -> list[Action]:
        asked, _ = vp.watch_asks[m.join_id]
        if asked != frm or not self._proven(vp, frm, m, self.epoch, "watch", now):
            return [Log("warning", f"{vp.vp}: watch accept from {frm[0]} with a bad proof")]
        del vp.watch_asks[m.join_id]
        if len(vp.backups) >= self.config.backups or frm[0] in self._parent_peers(vp):
            return [Send(frm[0], Detach(vp.vp, frm[1]))]
        vp.backups[frm] = BackupLink(now, Bounded(self.config.repair_memory))
        self._due(min(vp.next_ping_at, now + self._backup_timeout))
        return []

    def _parent_peers(self, vp: VirtualPeer) -> set[str]:
        """The physical peers that may not back ``vp`` up: its parents', under OHF."""
        return {p[0] for p in vp.parents} if self.config.routing == "ohf" else set()

    def _tick_backups(self, vp: VirtualPeer, now: float) -> list[Action]:
        """Drop silent backups, and (OHF) backups that have become parents since."""
        out: list[Action] = []
        parents = self._parent_peers(vp)
        for node, link in list(vp.backups.items()):
            if node[0] in parents:
                del vp.backups[node]
                out.append(Send(node[0], Detach(vp.vp, node[1])))
            elif now - link.last_heard > self._backup_timeout:
                del vp.backups[node]
                out.append(Log("info", f"{vp.vp}: backup {node[0]} silent, dropped"))
        for join_id, (_, asked) in list(vp.watch_asks.items()):
            if now - asked > 2 * self.config.join_timeout:
                del vp.watch_asks[join_id]
        return out

    def _list_for_watchers(self, vp: VirtualPeer, digest: bytes, event: Any, now: float
                           ) -> None:
        """Note an event for the digests of every peer ``vp`` backs up, with what the
        watcher's route test at its position reads: ``vp`` holds no token of theirs, so it
        lists all it takes (a watcher's credential is inside ``vp``'s)."""
        for link in vp.watchers.values():
            entry = self.crypto.digest_entry(event, vp.attribute, link.position)
            link.pending.append((now, digest, entry))
            del link.pending[:-self.config.digest_entries]
        if vp.watchers:
            self._due(self._digests_due(vp) or now)

    def _digests_due(self, vp: VirtualPeer) -> float | None:
        """When ``vp`` next sends digests: once an event waited ``digest_interval`` (its copy
        down the tree has had time to arrive), at most every ``digest_interval``."""
        oldest = [link.pending[0][0] for link in vp.watchers.values() if link.pending]
        if not oldest:
            return None
        return max(vp.next_digest_at, min(oldest) + self.config.digest_interval)

    def _tick_watchers(self, vp: VirtualPeer, now: float) -> list[Action]:
        cfg = self.config
        out: list[Action] = []
        for node, link in list(vp.watchers.items()):
            if now - link.last_heard > self._backup_timeout:
                del vp.watchers[node]
                out.append(Log("info", f"{vp.vp}: watcher {node[0]} silent, dropped"))
        due = self._digests_due(vp)
        if due is None or now < due:
            return out
        vp.next_digest_at = now + cfg.digest_interval
        for node, link in vp.watchers.items():
            ready = [(d, e) for t, d, e in link.pending if t + cfg.digest_interval <= now]
            link.pending = link.pending[len(ready):]
            if ready:
                ids, entries = zip(*ready, strict=True)
                out.append(Send(node[0], Digest(vp.vp, node[1], ids, entries)))
                self.stats.listed += len(ids)
            for d, _ in ready:
                link.offered.put(d, None)
        return out

    def _on_digest(self, vp: VirtualPeer, frm: Node, m: Digest, now: float) -> list[Action]:
        """Run the route test of this virtual peer's own token on each listed event it
        lacks (once per id, at most ``digest_entries`` per digest); take the matching ones
        from another of this peer's trees if it holds them, else pull them from the backup
        (again from a second backup that lists an event the first did not deliver)."""
        backup = vp.backups.get(frm)
        if backup is None:
            self.stats.drop("digest_from_non_backup")
            return [Log("info", f"{vp.vp}: digest from non-backup {frm[0]} dropped")]
        if len(m.ids) != len(m.entries) or len(m.ids) > self.config.digest_entries:
            self.stats.drop("digest_malformed")
            return [Log("warning", f"{vp.vp}: digest from {frm[0]} malformed or too long")]
        if now < backup.next_digest_at:  # a backup sends one per digest_interval
            self.stats.drop("digest_too_soon")
            return [Log("warning", f"{vp.vp}: digest from {frm[0]} too soon, dropped")]
        backup.next_digest_at = now + self.config.digest_interval / 2
        out: list[Action] = []
        wanted = []
        for digest, entry in zip(m.ids, m.entries, strict=True):
            if (vp.vp, digest) in self._seen_events or not self._wants(vp, entry):
                continue
            data = self._raw.get(digest)
            if data is not None:
                out += self._take_event(vp, self.address, digest, data, now)
            elif digest not in backup.pulled:  # pulled from none, or from another backup
                backup.pulled.put(digest, None)
                wanted.append(digest)
        self.stats.pulled += len(wanted)
        if wanted:
            out.append(Send(frm[0], Pull(vp.vp, frm[1], tuple(wanted))))
        return out

    def _wants(self, vp: VirtualPeer, entry: bytes) -> bool:
        """Does a digest entry pass ``vp``'s own token (of any epoch it holds)? A malformed
        entry does not; the answer is kept per entry (it depends on nothing else), since two
        backups list the same events, and a backup that pairs one entry with fresh ids
        must not cost a test per id."""
        known = vp.tested.get(entry)
        if known is None:
            self.stats.entries_tested += 1
            try:
                known = any(self.crypto.route_entry(self._own_token(vp, e), entry)
                            for e in sorted(vp.keys))
            except CryptoRejected:
                known = False
            vp.tested.put(entry, known)
        return known

    def _on_pull(self, vp: VirtualPeer, frm: Node, m: Pull, now: float) -> list[Action]:
        """Serve each id once, and only ids listed to this watcher and still held: a pull
        costs at most the events its digests listed, however often it is sent."""
        link = vp.watchers.get(frm)
        if link is None:
            self.stats.drop("pull_from_non_watcher")
            return [Log("info", f"{vp.vp}: pull from non-watcher {frm[0]} refused")]
        out: list[Action] = []
        for digest in m.ids:
            data = self._raw.get(digest) if digest in link.offered else None
            if data is not None:
                link.offered.pop(digest)
                out.append(Send(frm[0], Publish(vp.vp, frm[1], vp.attribute, data)))
        refused = len(m.ids) - len(out)
        if refused:
            self.stats.pulls_refused += refused
            out.append(Log("info", f"{vp.vp}: {refused} pulled ids from {frm[0]} refused"))
        return out

    # -- dispatch ----------------------------------------------------------------------------

    def receive(self, sender: str, message: Message | bytes, now: float) -> list[Action]:
        """Handle one message from the physical peer listening at ``sender``."""
        if self.stopped:
            return []
        if isinstance(message, bytes | bytearray):
            try:
                message = decode(bytes(message))
            except WireError as exc:
                return [Log("warning", f"malformed frame from {sender}: {exc}")]
        vp = self._target(message)
        if vp is None:
            return [Log("info", f"{type(message).__name__} from {sender} for unknown "
                                f"virtual peer {message.dst_vp!r} dropped")]
        return self._handlers[type(message)](vp, (sender, message.src_vp), message, now)

    def _target(self, m: Message) -> VirtualPeer | None:
        if m.dst_vp:
            return self.vpeers.get(m.dst_vp)
        if isinstance(m, Join | Publish):
            mine = [v for v in self.vpeers.values() if v.attribute == m.attribute and v.attached]
            return min(mine, key=lambda v: v.credential.position, default=None)
        return None


def _event_id(data: bytes) -> bytes:
    """The id of an event in digests and duplicate memories: its ciphertext's digest."""
    return hashlib.sha256(data).digest()[:EVENT_ID_BYTES]


def _retarget(m: Join, src_vp: str, dst_vp: str, hops: int) -> Join:
    return Join(src_vp, dst_vp, m.attribute, m.join_id, m.origin, m.origin_vp, hops,
                m.request, m.split, m.depth)


def _depth(vp: VirtualPeer) -> int:
    depth = vp.depth
    return -1 if depth is None else depth

