"""How a virtual peer finds its parents and how a full peer takes newcomers (report 7.2,
Algorithm 2): joins climb to the nearest covering peer and search down its subtree; a
full peer splits off a relay; recruits and swaps deepen trees that joins in arrival
order leave flat; under MCR the fine tokens are dealt over the parents.

Every step admits a peer only by opening its connection request
(:mod:`overlay.admission`), and links only go down the order of
:func:`~overlay.virtual.comes_first`, so no stale view of the tree can close a cycle.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ibe_pubsub.overlay.actions import Action, Connected, Log, Send
from ibe_pubsub.overlay.admission import (
    Admission,
    check_request,
    context,
    open_request,
    prove,
    proven,
)
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoSuite
from ibe_pubsub.overlay.deals import deal_tokens
from ibe_pubsub.overlay.family import Family
from ibe_pubsub.overlay.lifecycle import Lifecycle
from ibe_pubsub.overlay.repair import Repair
from ibe_pubsub.overlay.timers import Timer
from ibe_pubsub.overlay.virtual import (
    Bounded,
    ChildLink,
    Node,
    ParentLink,
    PendingJoin,
    SwapOffered,
    VirtualPeer,
    comes_first,
)
from ibe_pubsub.overlay.wire import (
    Accept,
    Detach,
    Handover,
    Join,
    JoinMiss,
    JoinSplit,
    Recruit,
    SwapAccept,
    SwapHandover,
    SwapOffer,
    Tokens,
)

#: Join timeouts after which an opened request or a search is of no use any more (the
#: newcomer retried, or a handover or split for it came long ago).
STALE_JOINS = 4


@dataclass
class _Opened:
    """A request this peer opened (kept so a swap handover can accept the newcomer)."""

    vp: str
    newcomer: Node
    admission: Admission
    at: float


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
    admission: Admission
    #: The deepest peer below that may split for the newcomer, with its depth.
    splitter: tuple[int, Node] | None = None


class Joining:
    """Joins, splits, swaps and token deals of one physical peer's virtual peers."""

    def __init__(self, crypto: CryptoSuite, config: OverlayConfig, rng: random.Random,
                 family: Family, repair: Repair, due: Callable[[float], None]) -> None:
        self.crypto = crypto
        self.config = config
        self.rng = rng
        self.family = family
        self.address = family.address
        self.repair = repair
        #: Tells the machine a timer may fall due then (see ``PeerMachine.next_tick_at``).
        self.due = due
        #: Directory contacts per attribute tree (never this peer itself).
        self.contacts: dict[str, list[str]] = {}
        #: Contacts whose join went unanswered -> until when others are tried first.
        self._silent: dict[str, float] = {}
        cap = config.dedup_capacity
        self._seen_joins: Bounded[tuple[str, bytes], None] = Bounded(cap)
        self._opened: Bounded[bytes, _Opened] = Bounded(cap)
        self._searches: Bounded[tuple[str, bytes], _Search] = Bounded(cap)

    def set_contacts(self, contacts: Mapping[str, Sequence[str]]) -> None:
        """Where joins go: addresses of peers of each tree, this peer's own left out."""
        self.contacts = {a: [c for c in cs if c != self.address] for a, cs in contacts.items()}

    def join_timers(self, vp: VirtualPeer) -> Iterator[Timer]:
        """A contact that left a join unanswered is passed over for a while; old joins are
        forgotten; a virtual peer short of parents retries its join."""
        cfg = self.config
        for join_id, pending in list(vp.joins.items()):
            if pending.contact and not pending.answered:
                yield pending.sent_at, cfg.join_timeout, False, self._silence, (pending,)
            yield pending.sent_at, 2 * cfg.join_timeout, True, _forget_join, (vp, join_id)
        if vp.rotating_until:
            yield vp.rotating_until, 0.0, False, self._end_rotation, (vp, None)
            return
        if (cfg.repairs and cfg.backup_searches and not vp.relay and vp.attached
                and not vp.backups and not vp.watch_asks):
            yield vp.next_backup_search_at, 0.0, False, self.search_backup, (vp,)
        if vp.state is Lifecycle.DETACHED:
            return
        wanted = self.wanted_links(vp)
        searching = vp.link_attempts < cfg.mcr_link_attempts
        # A parent on the root's peer sends all it should (under OHF it is all one wants).
        top = vp.beside_root
        if top and cfg.routing == "ohf" and len(vp.parents) > 1:
            root = max((link for link in vp.parents.values() if link.root),
                       key=lambda link: link.since)
            if root.last_heard > root.since:  # (alive: it answered a ping)
                yield root.since, cfg.failure_timeout, False, self._release_beside_root, (vp,)
        if len(vp.parents) >= wanted or (not searching and (top or len(vp.parents) >= 2)):
            # Enough (under MCR: two or one on the root's peer, once searches found no
            # more). Rotation only where two parents are wanted and neither is the root
            # (under MCR: one fine token). With several fine tokens every rotation
            # re-deals them: in the droppers experiment that took the link messages from
            # 41,000 to 97,000 and delivered no more.
            if (cfg.rotate_interval and cfg.pushes_backup and not top
                    and wanted == 2 == len(vp.parents)):
                yield vp.next_rotate_at, 0.0, False, self._rotate, (vp,)
            return
        if not vp.parents or searching:
            yield vp.next_join_at, 0.0, False, self._retry, (vp,)
        elif cfg.pushes_backup:
            # No second parent found: peers that joined since may cover it; one try a while.
            pause = cfg.rotate_interval / 2 or cfg.silent_contact_period
            yield vp.next_join_at, pause, False, self._retry_later, (vp,)
        # (Without push backups MCR shares a parent rather than search on.)

    def _release_beside_root(self, vp: VirtualPeer, now: float) -> list[Action]:
        """Under OHF the root's peer sends every event, so a virtual peer beside it lets go
        of its other parents, ``failure_timeout`` after the root's peer took it: make
        before break, as the events published before that link still come the old way. By
        the structure alone, so it tells nothing of what arrived; and a dropping parent
        goes, however few events it owed (demotion needs ``demote_after`` gaps)."""
        out: list[Action] = []
        for other in [p for p, link in vp.parents.items() if not link.root]:
            # Events it sent before the Detach reached it are still taken for a while.
            vp.former[other[0]] = now + 2 * self.config.failure_timeout
            out += [Send(other[0], Detach(vp.vp, other[1])), *self.lose_parent(vp, other, now)]
        return out

    def _rotate(self, vp: VirtualPeer, now: float) -> list[Action]:
        """Look for a third parent for a while (see ``OverlayConfig.rotate_interval``)."""
        self._schedule_rotation(vp, now)
        vp.rotating_until = now + 2 * self.config.join_timeout
        self.due(vp.rotating_until)
        return self.send_join(vp, now)

    def _end_rotation(self, vp: VirtualPeer, newcomer: Node | None, now: float
                      ) -> list[Action]:
        """A rotation's search ended: with a new parent, let go of the old one that has the
        most gaps, then the fewest events owed and sent, then is the oldest link (never one
        that proved itself the root: it sends all it should)."""
        vp.rotating_until = 0.0
        self.due(vp.next_rotate_at)
        old = [p for p, link in vp.parents.items() if p != newcomer and not link.root]
        if newcomer is None or len(old) < 2:
            return []
        worst = min(old, key=lambda p: (-sum(vp.parents[p].gaps),
                                        vp.parents[p].gaps.count(False), vp.parents[p].since))
        return [Send(worst[0], Detach(vp.vp, worst[1])), *self.lose_parent(vp, worst, now)]

    def search_backup(self, vp: VirtualPeer, now: float) -> list[Action]:
        """The pull repair finds backups through the ancestors that parents and backups
        name, which a lying parent can withhold: a virtual peer left without any, every
        ``backup_timeout`` seconds, asks under MCR the parent that sent it the most events
        it owed (never one with no such proof: a dropper would take the place and serve
        nothing), else searches for a covering peer itself (a join from a directory
        contact, whoever accepts it is asked to be a backup)."""
        vp.next_backup_search_at = now + self.repair.backup_timeout
        self.due(vp.next_backup_search_at)
        proven = {p: link.gaps.count(False) for p, link in vp.parents.items()
                  if p[0] != self.address and link.gaps.count(False)}
        if self.config.routing == "mcr" and proven:
            asked = self.repair.ask_backup(vp, max(proven, key=proven.__getitem__), now)
            if asked:
                return asked
        return self.send_join(vp, now, backup=True)

    def _schedule_rotation(self, vp: VirtualPeer, now: float) -> None:
        vp.next_rotate_at = now + self.config.rotate_interval * (0.5 + self.rng.random())
        self.due(vp.next_rotate_at)

    def _retry_later(self, vp: VirtualPeer, now: float) -> list[Action]:
        vp.link_attempts = self.config.mcr_link_attempts - 1
        return self._retry(vp, now)

    def _silence(self, pending: PendingJoin, now: float) -> list[Action]:
        self._silent[pending.contact] = now + self.config.silent_contact_period
        pending.contact = ""  # once per join
        return []

    def _retry(self, vp: VirtualPeer, now: float) -> list[Action]:
        """A retry asks the full peer where its search ends to split; one that keeps
        failing asks the full peer a swap offer named to split right away."""
        hint, vp.split_hint = vp.split_hint, None
        retry = any(p.sent_at < now for p in vp.joins.values())
        stuck = (vp.join_started is not None
                 and now - vp.join_started > 2 * self.config.join_timeout)
        target = hint[1] if hint and stuck and vp.state is Lifecycle.JOINING else None
        return self.send_join(vp, now, target, retry)

    def wanted_links(self, vp: VirtualPeer) -> int:
        """Parents ``vp`` looks for: under OHF one, or two with push backups (three while
        rotating, one below the tree's top); under MCR one per fine token, twice that with
        push backups (one more while rotating). A relay has its one local parent."""
        if vp.is_top:
            return 0
        if vp.relay:
            return 1
        if self.config.routing == "ohf":
            pushes = self.config.pushes_backup and not vp.beside_root
            return 2 + bool(vp.rotating_until) if pushes else 1
        keys = vp.keys.get(self.family.epoch)
        tokens = len(keys.dealt) if keys else 1
        return self.config.token_holders * tokens + bool(vp.rotating_until)

    def send_join(self, vp: VirtualPeer, now: float, target: Node | None = None,
                  split: bool = False, backup: bool = False) -> list[Action]:
        """Send a join to ``target`` or else to a directory contact, preferring those that
        have not left a join unanswered lately."""
        keys = vp.keys.get(self.family.epoch)
        if keys is None:
            return [Log("warning", f"{vp.vp}: no keys for epoch {self.family.epoch}, cannot join")]
        contact = ""
        if target is None:
            candidates = self.contacts.get(vp.attribute, [])
            if not candidates:
                return [Log("warning", f"{vp.vp}: no contact for tree {vp.attribute!r}")]
            # A join never succeeds below the joiner itself (it would close a cycle): its
            # children are the last contacts to try, as are those silent lately.
            below = {c[0] for r in (vp, *self.family.relays(self.family.creator(vp)))
                     for c in r.children}
            answering = [c for c in candidates if self._silent.get(c, 0.0) <= now]
            contact = self.rng.choice([c for c in answering if c not in below]
                                      or [c for c in candidates if c not in below]
                                      or answering or candidates)
            target = (contact, "")
        join_id = self.rng.randbytes(16)
        vp.joins[join_id] = PendingJoin(now, self.family.epoch, contact=contact, backup=backup)
        self.due(now + self.config.join_timeout)
        if not backup:
            vp.next_join_at = now + self.config.join_timeout
            vp.link_attempts += bool(vp.parents)
        return [Send(target[0], Join(vp.vp, target[1], vp.attribute, join_id, self.address,
                                     vp.vp, self.config.hop_limit, keys.request, split,
                                     depth_of(vp)))]

    def lose_parent(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        """Drop a parent link; the last one makes ``vp`` JOINING, with a join due now."""
        vp.parents.pop(parent, None)
        vp.assignment.pop(parent, None)
        vp.link_attempts = 0
        self.due(now)  # a retry for the missing link may be due now
        if vp.state is Lifecycle.ATTACHED:  # other parents remain
            return self.assign_tokens(vp, now)
        vp.join_started = now  # now JOINING
        vp.next_join_at = now
        return []

    def on_join(self, vp: VirtualPeer, frm: Node, m: Join, now: float) -> list[Action]:
        if (vp.vp, m.join_id) in self._seen_joins:
            return []
        if m.origin == self.address:
            # A peer never joins below its own virtual peers: end the search here at once.
            return self.miss(vp, frm, m)
        if m.hops <= 0 or m.attribute != vp.attribute:
            return [Log("debug", f"{vp.vp}: join {m.join_id.hex()[:8]} out of hops or tree")]
        request, error = check_request(self.crypto, m.request, vp.attribute, now,
                                       self.family.epochs)
        if error is not None:
            return [Log("warning", f"join from {frm[0]} dropped: {error}")]
        self._seen_joins.put((vp.vp, m.join_id), None)
        newcomer = (m.origin, m.origin_vp)
        admission = open_request(self.crypto, vp, request)
        if admission is None:
            if frm not in vp.parents or frm == newcomer:
                # From a contact (its own parent, when a peer joins through its child):
                # climb.
                return self._forward(vp, m, [p for p in vp.parents if p != newcomer], [])
            # From the parent (a full peer that covers the newcomer): offer a swap, which
            # only a newcomer that covers this peer (on its first join) can take; on a retry
            # the offer also tells the newcomer where a split may take it (the parent). This
            # peer cannot tell whether the newcomer is coarser: only an opener learns the
            # requester's position, so the newcomer decides by opening this peer's request.
            epoch = self.crypto.request_epoch(request)
            keys = vp.keys.get(epoch)
            if keys is None or m.depth >= 0:
                return self.miss(vp, frm, m)
            vp.swaps[m.join_id] = SwapOffered(frm, newcomer, epoch)
            return [Send(m.origin, SwapOffer(vp.vp, m.origin_vp, m.join_id, keys.request, *frm,
                                             depth_of(vp))),
                    *self.miss(vp, frm, m)]
        position = admission.position
        self._forget_stale(now)
        self._opened.put(m.join_id, _Opened(vp.vp, newcomer, admission, now))
        ups = [p for p in vp.parents if p != frm]
        if not vp.attached or not vp.precedes(position, m.origin_vp):
            # Nobody below this peer may take it either.
            return self._forward(vp, m, ups, []) + self.miss(vp, frm, m)
        fresh = not self._linked(vp, newcomer)
        splits = m.depth < 0 or self.config.pushes_backup
        if not fresh and splits:
            # Linked to the newcomer already: every peer below this one is a path through
            # it, so the search ends here at once (the parent that passed it down waits
            # for this miss to split); a search for a second path climbs on, since the
            # peers above cover the newcomer too.
            climb = m.depth >= 0 and self.config.pushes_backup
            creator = self.family.creator(vp)
            up = [p for p in creator.parents if p != frm] if climb else []
            return self._forward(creator, m, up, []) + self.miss(vp, frm, m)
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
        # relay may be split off, it climbs on from the peer the relays copy. With push
        # backups a search for a further parent splits too (without, MCR's further
        # parents share one instead).
        climbed = frm in vp.children and not vp.is_root
        if fresh and splits and (climbed or not downs or (
                m.split and frm == newcomer and m.dst_vp == vp.vp)):
            return self._split_or_climb(vp, m, admission, now)
        # The search stays below the first peer that may take the newcomer, so it costs
        # the covering part of that subtree, not of the whole tree.
        out = self._forward(vp, m, downs, others if m.depth < 0 else [])
        if not downs or m.hops <= 1:
            return out + self.miss(vp, frm, m)
        if fresh and splits:
            upstream = frm if frm in vp.parents else None
            self._searches.put((vp.vp, m.join_id),
                               _Search(m, set(downs), upstream, now, admission))
        return out

    def _forget_stale(self, now: float) -> None:
        """Opened requests and searches outlive their join's retries by nothing: each holds
        a decoded request (kilobytes with its group elements), and a root that opens
        hundreds of joins a minute (rotations, restarts) would otherwise keep thousands."""
        oldest = now - STALE_JOINS * self.config.join_timeout
        self._opened.expire(lambda o: o.at < oldest)
        self._searches.expire(lambda s: s.started < oldest)

    def _take(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, admission: Admission,
              now: float) -> list[Action] | None:
        """Adopt a newcomer not linked to them yet (see :meth:`_linked`) into a free slot of
        ``vp`` or of one of its relays; None when all are full."""
        free = next((r for r in (vp, *self.family.relays(self.family.creator(vp)))
                     if len(r.children) < self.config.max_children), None)
        return None if free is None else self._adopt(free, newcomer, join_id, admission, now)

    def _linked(self, vp: VirtualPeer, node: Node) -> bool:
        """Is ``node`` a parent of ``vp``, or a child of it or of one of its relays?"""
        relays = self.family.relays(self.family.creator(vp))
        return node in vp.parents or any(node in r.children for r in (vp, *relays))

    def _split_or_climb(self, vp: VirtualPeer, m: Join, admission: Admission, now: float
                        ) -> list[Action]:
        """Take the newcomer by a split; where no relay may be split off, pass the join on
        from the peer the relays copy."""
        creator = self.family.creator(vp)
        return (self._split(vp, (m.origin, m.origin_vp), m.join_id, admission, now)
                or self._forward(creator, m, list(creator.parents), []))

    def miss(self, vp: VirtualPeer, frm: Node, m: Join) -> list[Action]:
        """Tell the parent that passed a join down that it ends here (a swap probe, sent
        with a single hop, is not waited for and gets no answer)."""
        if m.hops <= 1 or frm not in vp.parents:
            return []
        return [Send(frm[0], JoinMiss(vp.vp, frm[1], m.join_id, "", "", -1))]

    def on_join_miss(self, vp: VirtualPeer, frm: Node, m: JoinMiss, now: float
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
                    and self._split_host(self.family.creator(vp), newcomer) is not None):
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

    def on_join_split(self, vp: VirtualPeer, frm: Node, m: JoinSplit, now: float
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

    def _adopt(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, admission: Admission,
               now: float) -> list[Action]:
        vp.children[newcomer] = ChildLink(now, admission.position,
                                          self.crypto.request_nonce(admission.request))
        self.due(now + self.config.failure_timeout)
        proof, cert = prove(self.crypto, vp, admission, context("join", (self.address, vp.vp),
                                                         newcomer))
        return [Send(newcomer[0], Accept(vp.vp, newcomer[1], join_id, proof, cert))]

    def _split(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, admission: Admission,
               now: float) -> list[Action]:
        """A full peer that covers the newcomer but none of whose children may: a relay
        copy of this virtual peer takes the slot of one child (of the peer it copies or of
        its shallowest relay that has one), that child and the newcomer."""
        vp = self.family.creator(vp)
        host = self._split_host(vp, newcomer)
        if host is None:
            return []
        relay = self.family.add(vp.attribute, vp.credential,
                                f"{host.vp}.{self.rng.randbytes(3).hex()}")
        self.family.forget_relays(vp.vp)
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
        relays = self.family.relays(creator)
        if ((not creator.is_top and len(relays) >= self.config.max_relays)
                or self.config.max_children < 2):
            return None
        return next((h for h in (creator, *relays) if self._movable(h, newcomer)), None)

    def _movable(self, host: VirtualPeer, newcomer: Node) -> list[Node]:
        """Children a split may move to the new relay: not relays, not the newcomer."""
        return sorted(c for c in host.children if not self.family.is_relay(c) and c != newcomer)

    def on_accept(self, vp: VirtualPeer, frm: Node, m: Accept, now: float) -> list[Action]:
        """A proven acceptance of one of ``vp``'s joins: a new parent, if it wants one."""
        pending = vp.joins.get(m.join_id)
        if pending is None or pending.epoch not in vp.keys:
            return [Log("info", f"{vp.vp}: accept from {frm[0]} for no pending join, ignored")]
        if not proven(self.crypto, self.address, vp, frm, m, pending.epoch, "join", now):
            return [Log("warning", f"{vp.vp}: accept from {frm[0]} with a bad proof dropped")]
        pending.answered = True
        if pending.backup:  # a covering peer found by a backup search: not a parent
            detach = [] if frm in vp.parents else [Send(frm[0], Detach(vp.vp, frm[1]))]
            parents = {p[0] for p in vp.parents}
            return detach + ([] if frm[0] in parents else self.repair.ask_backup(vp, frm, now))
        if frm in vp.parents:  # the request reached this parent twice: already linked
            return []
        if (frm[0] == self.address or frm in vp.children
                or len(vp.parents) >= self.wanted_links(vp) or self.refuses(vp, frm, now)):
            return [Send(frm[0], Detach(vp.vp, frm[1]))]
        return self._add_parent(vp, frm, now, root=bool(m.certificate))

    def refuses(self, vp: VirtualPeer, parent: Node, now: float,
                replacing: Node | None = None) -> bool:
        """May ``vp`` not take ``parent`` (in place of ``replacing``)? A demoted peer is
        refused for a while; with push backups a parent on another one's peer would be no
        second path."""
        return (vp.shunned.get(parent[0], -1.0) > now
                or (self.config.pushes_backup and any(
                    parent[0] == p[0] for p in vp.parents if p != replacing)))

    def _add_parent(self, vp: VirtualPeer, parent: Node, now: float, root: bool = False
                    ) -> list[Action]:
        vp.parents[parent] = ParentLink(now, since=now, root=root,
                                        gaps=deque(maxlen=self.config.demote_window),
                                        sent=Bounded(self.config.dedup_capacity))
        vp.shunned = {a: t for a, t in vp.shunned.items() if t > now}
        out: list[Action] = [Send(n[0], Detach(vp.vp, n[1])) for n in vp.handed_over]
        vp.handed_over.clear()
        if vp.next_rotate_at <= now:  # (never, or long ago: not right now)
            self._schedule_rotation(vp, now)
        if not vp.next_backup_search_at:
            vp.next_backup_search_at = now + self.repair.backup_timeout
            self.due(vp.next_backup_search_at)
        if not vp.relay:
            vp.recruits_left = self.config.recruit_rounds
            vp.next_recruit_at = now + self.config.recruit_interval * (0.5 + self.rng.random())
            self.due(vp.next_recruit_at)
        self.due(min(vp.next_ping_at, now + self.config.failure_timeout))
        started = vp.join_started if vp.join_started is not None else now
        if len(vp.parents) >= self.wanted_links(vp):
            vp.join_started = None
        out.append(Connected(vp.attribute, vp.vp, parent[0], len(vp.parents), started, now))
        if vp.rotating_until and len(vp.parents) > 2:
            out += self._end_rotation(vp, parent, now)
        return out + self.assign_tokens(vp, now) + self.repair.on_new_parent(vp, parent)

    def assign_tokens(self, vp: VirtualPeer, now: float) -> list[Action]:
        """MCR: deal the fine credentials' tokens (of every valid epoch, a credential's
        tokens together) over the parents, each to ``config.token_holders`` of them (see
        :func:`deal_tokens`), and tell each parent whose share changed."""
        if self.config.routing != "mcr" or vp.relay or vp.is_root or not vp.parents:
            return []
        fine: dict[int, list[bytes]] = {}
        for epoch in sorted(vp.keys):
            keys = vp.keys[epoch]
            for i, (token, _) in enumerate(keys.dealt):
                fine.setdefault(i, []).append(token)
        held = {p: {i for i, tokens in fine.items() if tokens[0] in vp.assignment.get(p, ())}
                for p in vp.parents}
        dealt = deal_tokens(list(fine), list(vp.parents), held, self.config.token_holders)
        out: list[Action] = []
        for p, groups in dealt.items():
            tokens = tuple(sorted(t for i in groups for t in fine[i]))
            if vp.assignment.get(p) != tokens:
                vp.assignment[p] = tokens
                vp.parents[p].dealt = now
                out.append(Send(p[0], Tokens(vp.vp, p[1], tokens)))
        return out

    # -- swaps (Algorithm 2, line 9) -----------------------------------------------------------

    def recruit(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        vp.recruits_left -= 1
        vp.next_recruit_at = now + self.config.recruit_interval
        self.due(vp.next_recruit_at)
        keys = vp.keys.get(self.family.epoch)
        if keys is None or len(vp.children) >= self.config.max_children:
            return []
        join_id = self.rng.randbytes(16)
        vp.joins[join_id] = PendingJoin(now, self.family.epoch, recruit=True)
        return [Send(parent[0], Recruit(vp.vp, parent[1], join_id, keys.request))]

    def on_recruit(self, vp: VirtualPeer, frm: Node, m: Recruit, now: float
                    ) -> list[Action]:
        """Pass a child's request to a sample of this peer's (and its relays') children
        that are finer than it, as single-hop swap probes that seem to come from their
        own parent."""
        link = vp.children.get(frm)
        if link is None:
            return [Log("info", f"{vp.vp}: recruit from non-child {frm[0]} ignored")]
        request, error = check_request(self.crypto, m.request, vp.attribute, now,
                                       self.family.epochs)
        if error is not None or self.crypto.request_nonce(request) != link.nonce:
            return [Log("warning", f"{vp.vp}: recruit from {frm[0]} dropped: "
                                   f"{error or 'not the request it joined with'}")]
        creator = self.family.creator(vp)
        finer = [(host, c) for host in (creator, *self.family.relays(creator))
                 for c, other in host.children.items()
                 if c != frm and c[0] != frm[0] and other.position > link.position
                 and not self.family.is_relay(c)]
        probes = self.rng.sample(finer, min(self.config.recruit_sample, len(finer)))
        return [Send(c[0], Join(host.vp, c[1], vp.attribute, m.join_id, frm[0], frm[1], 1,
                                m.request, False, -1)) for host, c in probes]

    def on_swap_offer(self, vp: VirtualPeer, frm: Node, m: SwapOffer, now: float
                       ) -> list[Action]:
        pending = vp.joins.get(m.join_id)
        if (pending is None or (vp.state is Lifecycle.ATTACHED and not pending.recruit)
                or frm in vp.children or frm in vp.parents):
            return [Log("debug", f"{vp.vp}: swap offer from {frm[0]} not wanted")]
        request, error = check_request(self.crypto, m.request, vp.attribute, now,
                                       self.family.epochs)
        if error is not None:
            return [Log("warning", f"swap offer from {frm[0]} dropped: {error}")]
        pending.answered = True
        admission = open_request(self.crypto, vp, request)
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
        self.due(now + self.config.failure_timeout)
        proof = self.crypto.acceptance_proof(admission.sw, request,
                                             context("swap", (self.address, vp.vp), frm))
        return [Send(frm[0], SwapAccept(vp.vp, frm[1], m.join_id, proof))]

    def on_swap_accept(self, vp: VirtualPeer, frm: Node, m: SwapAccept, now: float
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
        if offer.old_parent not in vp.parents or (
                frm not in vp.parents and self.refuses(vp, frm, now, offer.old_parent)):
            return [Log("info", f"{vp.vp}: swap with {frm[0]} is stale or refused, declined"),
                    Send(frm[0], Detach(vp.vp, frm[1]))]
        vp.parents.pop(offer.old_parent)
        vp.assignment.pop(offer.old_parent, None)
        # The parents changed (one fewer, or none on the root's peer any more): a search
        # for another may be due, from now on.
        vp.next_join_at = max(vp.next_join_at, now)
        self.due(now)
        vp.former = {a: t for a, t in vp.former.items() if t >= now}
        # The old parent forwards for failure_timeout after the handover reaches it.
        vp.former[offer.old_parent[0]] = now + 2 * self.config.failure_timeout
        out: list[Action] = [Send(offer.old_parent[0], SwapHandover(vp.vp, offer.old_parent[1],
                                                                    m.join_id))]
        if frm in vp.parents:
            return out + self.assign_tokens(vp, now)
        return out + self._add_parent(vp, frm, now)

    def on_swap_handover(self, vp: VirtualPeer, frm: Node, m: SwapHandover, now: float
                          ) -> list[Action]:
        if frm not in vp.children:
            return [Log("info", f"{vp.vp}: swap handover from non-child {frm[0]} ignored")]
        # The child's new parent may have passed on an event before adopting it, which only
        # reaches this peer now: keep forwarding to the child for a while (it takes events
        # from a former parent that long, see on_swap_accept).
        vp.released = {n: r for n, r in vp.released.items() if r[1] > now}
        vp.released[frm] = (vp.children.pop(frm), now + self.config.failure_timeout)
        opened = self._opened.get(m.join_id)
        if (opened is None or opened.vp != vp.vp or opened.newcomer in vp.children
                or not vp.attached or not vp.precedes(opened.admission.position,
                                                      opened.newcomer[1])):
            return [Log("debug", f"{vp.vp}: {frm[0]} swapped away, its newcomer not taken")]
        return self._adopt(vp, opened.newcomer, m.join_id, opened.admission, now)


def _forget_join(vp: VirtualPeer, join_id: bytes, now: float) -> list[Action]:
    del vp.joins[join_id]
    return []


def _retarget(m: Join, src_vp: str, dst_vp: str, hops: int) -> Join:
    return Join(src_vp, dst_vp, m.attribute, m.join_id, m.origin, m.origin_vp, hops,
                m.request, m.split, m.depth)


def depth_of(vp: VirtualPeer) -> int:
    """A virtual peer's depth on the wire: -1 while unknown."""
    depth = vp.depth
    return -1 if depth is None else depth
