"""The overlay protocol as a sans-I/O state machine (report 7.1-7.4, Algorithm 2).

A :class:`PeerMachine` is one physical peer. It is driven only by its methods:
messages (:meth:`receive`), timer ticks (:meth:`tick`), and the user's
:meth:`join`, :meth:`publish`, :meth:`leave`, :meth:`rekey`; each returns a list of
actions (:mod:`overlay.actions`). It holds no sockets and reads no clock or
randomness except the ``now`` and the seeded ``random.Random`` it is given, so
the asyncio peer and the simulator run exactly the same protocol code.

The machine wires together the parts of the protocol, each in a module of its own:
its virtual peers and keys (:mod:`overlay.family`), joins, splits and swaps
(:mod:`overlay.joining`), events (:mod:`overlay.dissemination`) and their repair
(:mod:`overlay.repair`); it keeps the heartbeats and the timers. Each virtual peer
moves through the states of :mod:`overlay.lifecycle`.

Any message that does not decode, check or fit the machine's state is dropped
with a :class:`~overlay.actions.Log` action and changes nothing else.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ibe_pubsub.credentials import Event
from ibe_pubsub.overlay.actions import Action, Log, Send
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoRejected, CryptoSuite, RootKit, SubscriberKit
from ibe_pubsub.overlay.demotion import Demotion
from ibe_pubsub.overlay.dissemination import Dissemination
from ibe_pubsub.overlay.family import Family
from ibe_pubsub.overlay.joining import Joining, depth_of
from ibe_pubsub.overlay.lifecycle import Lifecycle
from ibe_pubsub.overlay.repair import BACKUP_HEARTBEATS, Repair
from ibe_pubsub.overlay.stats import Stats
from ibe_pubsub.overlay.timers import Timer, due, fired
from ibe_pubsub.overlay.virtual import Node, VirtualPeer
from ibe_pubsub.overlay.wire import (
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

#: Messages a leaving peer drops: they would give it a newcomer.
LEAVING_IGNORES = (Join, JoinSplit, Watch, Recruit, SwapOffer, SwapAccept, SwapHandover)


class PeerMachine:
    """One physical peer: its virtual peers, its keys, its duplicate memories."""

    def __init__(self, address: str, crypto: CryptoSuite, config: OverlayConfig,
                 rng: random.Random, kit: SubscriberKit | None = None,
                 roots: Sequence[RootKit] = ()) -> None:
        self.address = address
        self.crypto = crypto
        self.config = config
        self.rng = rng
        self.stats = Stats()
        self.stopped = False
        #: No :meth:`tick` before this time has anything to do (a heartbeat, failure timeout,
        #: join retry or key expiry falls due then), so a driver may skip ticks until it.
        #: A cheap lower bound of :meth:`deadline`, lowered as timers are set.
        self.next_tick_at = 0.0
        self._expiry: dict[int, float] = {}
        #: Set by :meth:`leave`: until when the children handed over are still served.
        self.leaving_until: float | None = None
        self.family = Family(address, rng, config.repair_memory)
        self.vpeers = self.family.vpeers
        self.kits = self.family.kits
        self.dissemination = Dissemination(crypto, config, self.stats, self.family, self.kits,
                                           listed=self._list_for_watchers,
                                           opened=self._opened)
        self.repair = Repair(crypto, config, rng, self.stats, self.family,
                             self.dissemination, self._due)
        self.joining = Joining(crypto, config, rng, self.family, self.repair, self._due)
        self.demotion = Demotion(crypto, config, self.stats, self.family, self.dissemination,
                                 self.joining.lose_parent, self._due,
                                 leaving=lambda: self.leaving)
        for root in roots:
            vp = self.family.add(root.attribute, root.credential,
                                 "." + self.rng.randbytes(6).hex())  # first in the order
            vp.roots[root.epoch] = root
        if kit is not None:
            self.family.install(kit)
        self._open_epochs()
        j, r = self.joining, self.repair
        self._handlers: dict[type[Message], Callable[..., list[Action]]] = {
            Join: j.on_join, JoinMiss: j.on_join_miss, JoinSplit: j.on_join_split,
            Recruit: j.on_recruit, Accept: self._on_accept,
            Detach: self._on_detach, SwapOffer: j.on_swap_offer,
            SwapAccept: j.on_swap_accept, SwapHandover: j.on_swap_handover,
            Tokens: self._on_tokens, Ping: self._on_ping,
            Pong: self._on_pong, Handover: self._on_handover,
            Publish: self.dissemination.on_publish,
            Watch: r.on_watch, Digest: r.on_digest, Pull: r.on_pull}

    def _list_for_watchers(self, vp: VirtualPeer, digest: bytes, event: Any, now: float
                           ) -> None:
        """Every event a virtual peer takes goes into its watchers' digests (the repair is
        built after the dissemination it reads from)."""
        self.repair.list_for_watchers(vp, digest, event, now)

    def _opened(self, tree: str, digest: bytes, event: Any, plain: Event, now: float
                ) -> None:
        """Every event decrypted here goes to the parents' gap bookkeeping (built after
        the dissemination it reads from)."""
        self.demotion.owed(tree, digest, event, plain, now)

    # -- set-up and user operations -----------------------------------------------------------

    @property
    def epochs(self) -> set[int]:
        """Epochs whose connection requests and events this peer accepts."""
        return self.family.epochs

    @property
    def epoch(self) -> int:
        return self.family.epoch

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

    def set_contacts(self, contacts: Mapping[str, Sequence[str]]) -> None:
        """Replace the directory contacts (addresses of peers of each tree) that joins and
        retries go to, e.g. after a fresh directory lookup."""
        self.joining.set_contacts(contacts)

    def join(self, contacts: Mapping[str, Sequence[str]], now: float) -> list[Action]:
        """Connect every subscriber virtual peer to its tree through one of ``contacts``
        (addresses of peers of the tree, e.g. its root, per attribute)."""
        self.set_contacts(contacts)
        out: list[Action] = []
        for vp in self.vpeers.values():
            if not vp.is_root and vp.state is not Lifecycle.ATTACHED:
                vp.join_started = now
                out += self.joining.send_join(vp, now)
        return out

    def leave(self, now: float) -> list[Action]:
        """Leave gracefully, make before break: hand the children to a parent and go on
        forwarding to them until each has detached (it does once linked elsewhere) or
        ``leave_linger`` has passed; only then drop the parent links. Takes no newcomer
        meanwhile; :attr:`stopped` once done, every virtual peer DETACHED. Its own relays
        keep their links to it until then (they are this peer)."""
        if self.leaving_until is not None:
            return []
        out: list[Action] = []
        self.leaving_until = until = now + self.config.leave_linger
        for vp in self.vpeers.values():
            heir = next(iter(self.family.creator(vp).parents), ("", ""))  # a peer that stays
            for child, link in list(vp.children.items()):
                if child[0] == self.address:
                    continue
                out.append(Send(child[0], Handover(vp.vp, child[1], heir[0], heir[1])))
                if heir[0]:  # (the top hands over to nobody)
                    vp.released[child] = (link, until)
                del vp.children[child]
            vp.recruits_left = 0
            vp.released = {n: (r[0], min(r[1], until)) for n, r in vp.released.items()}
        self._due(until)
        return out + self._left(now)

    @property
    def leaving(self) -> bool:
        return self.leaving_until is not None and not self.stopped

    def _left(self, now: float) -> list[Action]:
        """End a leave once no child handed over still depends on this peer, and at
        ``leaving_until`` whatever happens."""
        assert self.leaving_until is not None
        if now < self.leaving_until and any(
                r[1] > now for vp in self.vpeers.values() for r in vp.released.values()):
            return []
        out: list[Action] = []
        for vp in self.vpeers.values():
            for parent in (*vp.parents, *vp.backups):
                out.append(Send(parent[0], Detach(vp.vp, parent[1])))
            vp.parents.clear()
            vp.backups.clear()
            vp.watchers.clear()
            vp.released.clear()
            vp.children.clear()
            vp.join_started = None
        self.family.forget_relays()
        self.stopped = True
        self.next_tick_at = float("inf")
        return out

    def rekey(self, now: float, kit: SubscriberKit | None = None,
              roots: Sequence[RootKit] = (), grace: float | None = None) -> list[Action]:
        """Install the keys of a new epoch; the older epochs stay valid for ``grace``
        seconds more (default: the configured grace period)."""
        grace = self.config.grace if grace is None else grace
        out: list[Action] = []
        for old in self.epochs:
            self._expiry.setdefault(old, now + grace)
        self._due(now + grace)
        for root in roots:
            for vp in self.vpeers.values():
                if vp.is_root and vp.attribute == root.attribute:
                    vp.roots[root.epoch] = root
        if kit is not None:
            for vp in self.family.install(kit):
                vp.join_started = now
                out += self.joining.send_join(vp, now)
        for vp in self.vpeers.values():
            out += self.joining.assign_tokens(vp, now)
        self._open_epochs()
        return out

    def _open_epochs(self) -> None:
        """The suite may cache the events of every epoch this peer holds keys of."""
        for epoch in self.epochs:
            self.crypto.open_epoch(epoch)

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Run every timer that has fired: heartbeats, failure detection, join retries,
        digests, expiry of old epochs."""
        if self.stopped:
            return []
        out: list[Action] = []
        for timer in self._timers():
            if self.stopped:  # (a leave ended in this tick)
                break
            if fired(timer, now):
                out += timer[3](*timer[4], now)
        self.next_tick_at = self.deadline()
        return out

    def deadline(self) -> float:
        """The earliest time a timer can fire, from scratch: no :meth:`tick` before it does
        anything, and one at or after it does."""
        return min(map(due, self._timers()), default=float("inf"))

    def _timers(self) -> Iterator[Timer]:
        """Every pending timer, in the order a tick runs them. The listing is lazy: each
        timer is read off the state when reached, after the ones before it ran (a lost
        parent makes a join retry due at once)."""
        if self.stopped:
            return
        if self.leaving_until is not None:  # done once the last child handed over is served
            last = max((r[1] for vp in self.vpeers.values() for r in vp.released.values()),
                       default=0.0)
            yield min(self.leaving_until, last), 0.0, False, self._left, ()
        for epoch, until in list(self._expiry.items()):
            if epoch != self.epoch:
                yield until, 0.0, False, self._expire, (epoch,)
        if not self.leaving:  # (a leaving peer neither rejoins nor demotes)
            yield from self.demotion.timers()
        cfg = self.config
        for vp in list(self.vpeers.values()):
            # Links inside this peer (to and from its relays) cannot fail apart: no heartbeats.
            for child, link in list(vp.children.items()):
                if child[0] != self.address:
                    yield (link.last_heard, cfg.failure_timeout, True, self._child_silent,
                           (vp, child))
            if vp.watchers:
                yield from self.repair.watcher_timers(vp)
            if vp.is_top:
                continue
            if vp.backups or vp.watch_asks:
                yield from self.repair.backup_timers(vp)
            # Pings and recruits go to the parents remote before the silent ones above are
            # dropped (one found silent just now gets a last ping).
            remote = [p for p in vp.parents if p[0] != self.address]
            for parent in remote:
                yield (vp.parents[parent].last_heard, cfg.failure_timeout, True,
                       self._parent_silent, (vp, parent))
            if remote or vp.backups:
                yield vp.next_ping_at, 0.0, False, self._ping, (vp, remote)
            if vp.recruits_left and remote:
                yield vp.next_recruit_at, 0.0, False, self.joining.recruit, (vp, remote[0])
            if not self.leaving:
                yield from self.joining.join_timers(vp)

    def _due(self, at: float) -> None:
        """Something :meth:`tick` checks may fall due at ``at``."""
        self.next_tick_at = min(self.next_tick_at, at)

    def _expire(self, epoch: int, now: float) -> list[Action]:
        self.crypto.drop_epoch(epoch)
        self.kits.pop(epoch, None)
        self.dissemination.forget_epoch(epoch)
        self._expiry.pop(epoch, None)
        for vp in self.vpeers.values():
            vp.keys.pop(epoch, None)
            vp.roots.pop(epoch, None)
        return [Log("info", f"keys of epoch {epoch} expired")]

    def _child_silent(self, vp: VirtualPeer, child: Node, now: float) -> list[Action]:
        del vp.children[child]
        return [Log("info", f"{vp.vp}: child {child[0]} silent, dropped")]

    def _parent_silent(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        self.stats.parents_lost += 1
        return [Log("info", f"{vp.vp}: parent {parent[0]} silent, rejoining"),
                *self.joining.lose_parent(vp, parent, now)]

    def _ping(self, vp: VirtualPeer, remote: list[Node], now: float) -> list[Action]:
        """A heartbeat to the remote parents, and every few rounds to the backups."""
        vp.next_ping_at = now + self.config.heartbeat_interval
        vp.pings += 1
        backups = list(vp.backups) if vp.pings % BACKUP_HEARTBEATS == 0 else []
        pinged = dict.fromkeys([*remote, *backups])  # a parent may be a backup
        return [Send(p[0], Ping(vp.vp, p[1])) for p in pinged]

    # -- links -------------------------------------------------------------------------------

    def _on_accept(self, vp: VirtualPeer, frm: Node, m: Accept, now: float) -> list[Action]:
        if m.join_id in vp.watch_asks:
            return self.repair.on_watch_accept(vp, frm, m, now)
        return self.joining.on_accept(vp, frm, m, now)

    def _on_detach(self, vp: VirtualPeer, frm: Node, m: Detach, now: float) -> list[Action]:
        released = vp.released.get(frm) if self.leaving else None
        if released is not None:
            # A handed-over child linked elsewhere: what its new parent passed on before
            # adopting it may still reach it only through here, for a little while (as
            # after a swap).
            until = min(released[1], now + self.config.failure_timeout)
            vp.released[frm] = (released[0], until)
            self._due(until)
            return []
        if vp.children.pop(frm, None) is None and vp.watchers.pop(frm, None) is None:
            return [Log("debug", f"{vp.vp}: detach from non-child {frm[0]} ignored")]
        return []

    def _on_tokens(self, vp: VirtualPeer, frm: Node, m: Tokens, now: float) -> list[Action]:
        # Tokens sent before a split's handover reached the child belong to the link
        # wherever it is now.
        holder = self.family.link_holder(vp, frm)
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
        holder = self.family.link_holder(vp, frm) or vp
        watcher = vp.watchers.get(frm)
        links = [x for x in (holder.children.get(frm), watcher) if x is not None]
        for link in links:
            link.last_heard = now
        src = vp if watcher is not None else holder
        return [Send(frm[0], Pong(src.vp, frm[1], bool(links), depth_of(src),
                                  *(self.repair.ancestor(src) if links else ("", ""))))]

    def _on_pong(self, vp: VirtualPeer, frm: Node, m: Pong, now: float) -> list[Action]:
        """A parent's or backup's answer; either may name an ancestor to ask for backup."""
        link, backup = vp.parents.get(frm), vp.backups.get(frm)
        if link is None and backup is None:
            return [Log("debug", f"{vp.vp}: pong from non-parent {frm[0]} ignored")]
        if not m.ok:
            vp.backups.pop(frm, None)
            self._due(vp.next_backup_search_at)  # the backup search may be due now
            if link is None:
                return [Log("info", f"{vp.vp}: backup {frm[0]} dropped us")]
            return [Log("info", f"{vp.vp}: parent {frm[0]} dropped us, rejoining"),
                    *self.joining.lose_parent(vp, frm, now)]
        for heard in (link, backup):
            if heard is not None:
                heard.last_heard = now
        if link is not None:
            link.depth = None if m.depth < 0 else m.depth
        return self.repair.ask_backup(vp, (m.ancestor, m.ancestor_vp), now)

    def _on_handover(self, vp: VirtualPeer, frm: Node, m: Handover, now: float
                     ) -> list[Action]:
        if frm not in vp.parents:
            return [Log("info", f"{vp.vp}: handover from non-parent {frm[0]} ignored")]
        if m.new_parent == frm[0] and m.new_parent_vp:
            # A split moved this child to a relay of the same peer (a copy of the parent,
            # already holding the link): take the new parent over, no rejoin, no gap.
            parent = (m.new_parent, m.new_parent_vp)
            if parent in vp.parents:  # (MCR without push backups: linked to it too)
                return self.joining.lose_parent(vp, frm, now)
            vp.parents[parent] = vp.parents.pop(frm)
            if frm in vp.assignment:
                vp.assignment[parent] = vp.assignment.pop(frm)
            return []
        # A leaving parent: it forwards until this peer has a new parent and detaches.
        vp.former = {a: t for a, t in vp.former.items() if t >= now}
        vp.former[frm[0]] = now + self.config.leave_linger
        vp.handed_over.add(frm)
        out = self.joining.lose_parent(vp, frm, now)
        target = (m.new_parent, m.new_parent_vp) if m.new_parent else None
        return out + self.joining.send_join(vp, now, target)

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
        if self.leaving and isinstance(message, LEAVING_IGNORES):
            # Takes no newcomer; a search passed down here ends here (so the peer above
            # need not wait for the join to time out).
            vp = self._target(message)
            ends = (self.joining.miss(vp, (sender, message.src_vp), message)
                    if isinstance(message, Join) and vp is not None else [])
            return [Log("debug", f"{type(message).__name__} from {sender} ignored: leaving"),
                    *ends]
        vp = self._target(message)
        if vp is None:
            dropped = Log("info", f"{type(message).__name__} from {sender} for unknown "
                                  f"virtual peer {message.dst_vp!r} dropped")
            if isinstance(message, Ping) and message.dst_vp:
                # A heartbeat to a virtual peer this process does not have: its child from
                # before a restart at this address. Told at once, it rejoins now rather
                # than after the failure timeout (while events to this peer reach nobody).
                return [dropped, Send(sender, Pong(message.dst_vp, message.src_vp, False, -1,
                                                   "", ""))]
            return [dropped]
        return self._handlers[type(message)](vp, (sender, message.src_vp), message, now)

    def _target(self, m: Message) -> VirtualPeer | None:
        if m.dst_vp:
            return self.vpeers.get(m.dst_vp)
        if isinstance(m, Join | Publish):
            mine = [v for v in self.vpeers.values() if v.attribute == m.attribute and v.attached]
            return min(mine, key=lambda v: v.credential.position, default=None)
        return None
