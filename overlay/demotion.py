"""Demotion: a virtual peer replaces a parent that keeps missing events it owed.

A physical peer often gets an event by more than one path in one tree: from a second
parent (the push backup), or pulled from a backup. Once it has decrypted an event that
came down a tree it knows the event's values, and so which of its virtual peers in that
tree encloses them: every parent of that virtual peer owed it the event (under MCR, the
parents dealt the fine token whose credential encloses it: two with push backups, and a
holder that keeps dropping is charged though the other one delivers). A parent that has
not sent it ``gap_wait`` seconds after this peer first had it has a *gap*; after
``demote_after`` gaps among the last ``demote_window`` events it owed, the virtual peer
detaches from it, joins anew, and refuses that peer's acceptances for ``shun_period``
seconds. A backup (the pull repair) owed a digest entry for each such event: one that
keeps listing none is dropped.

Only evidence that holds counts: an event counts against a parent only once its
publisher's signature verified (anyone can encrypt), only if it came down the same tree
(a publisher may skip a root, a root may be down), only if it came after the link was made
(plus ``gap_wait``), never against a parent that proved itself the tree's root. This
peer's duplicate memory is shared by all senders, and junk enters it before any signature
is checked, so a co-parent can make it forget an old event and then replay it as new. Two
memories junk cannot flush stop that: the parent's own record of what it sent (``ParentLink.sent``),
and the events this peer verified (every checked event is verified, and a verified
event that comes as new is no evidence). Events carry no time, so an event this peer
never verified (published before it joined, say) or verified more than
``dedup_capacity`` verified events ago can still be replayed against a parent. What
this can still reveal is in docs/scheme.md (known limits): the ``Detach`` of a demotion
depends on which events the virtual peer's credential encloses.

A virtual peer that missed an event its credential encloses also takes it from this
peer's store at the check, so its own children get it (the routing rule decides, as for
any event).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ibe_pubsub.credentials import Credential, Event, enclosing_path
from ibe_pubsub.overlay.actions import Action, Log, Send
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoSuite
from ibe_pubsub.overlay.dissemination import Dissemination
from ibe_pubsub.overlay.family import Family
from ibe_pubsub.overlay.stats import Stats
from ibe_pubsub.overlay.timers import Timer
from ibe_pubsub.overlay.virtual import Node, VirtualPeer
from ibe_pubsub.overlay.wire import Detach


@dataclass(frozen=True)
class _Check:
    """Who owed ``vp_ids`` the event ``digest``, asked ``gap_wait`` after ``first_at``."""

    due: float
    first_at: float
    digest: bytes
    event: Any
    vp_ids: tuple[str, ...]
    #: The event's leaf in the tree: which fine tokens route it (MCR).
    leaf: Credential
    #: Asks the backups (did they list it?) rather than the parents (did they send it?).
    backups: bool = False
    #: MCR: each virtual peer's deal of fine tokens when the event came (a later deal,
    #: after a demotion, must not blame the parent that takes the tokens over).
    deals: dict[str, dict[Node, tuple[bytes, ...]]] | None = None


class Demotion:
    """The gap bookkeeping of one physical peer's virtual peers."""

    def __init__(self, crypto: CryptoSuite, config: OverlayConfig, stats: Stats,
                 family: Family, dissemination: Dissemination,
                 lose_parent: Callable[[VirtualPeer, Node, float], list[Action]],
                 due: Callable[[float], None], leaving: Callable[[], bool]) -> None:
        self.crypto = crypto
        self.config = config
        self.stats = stats
        self.family = family
        self.dissemination = dissemination
        #: How the joining drops a parent (and starts a join for a new one).
        self.lose_parent = lose_parent
        self.due = due
        #: Whether the peer is leaving (it then takes no new evidence).
        self.leaving = leaving
        self._checks: deque[_Check] = deque(maxlen=config.dedup_capacity)
        self._backup_checks: deque[_Check] = deque(maxlen=config.dedup_capacity)

    def owed(self, tree: str, digest: bytes, event: Any, plain: Event, now: float) -> None:
        """An event decrypted here at its first arrival, down ``tree``: note a check,
        ``gap_wait`` from now, for the attached subscriber virtual peers of that tree whose
        credential encloses it."""
        if not self.config.demote_after or tree not in plain.values or self.leaving():
            return
        leaf = enclosing_path(self.crypto.schema, tree, plain.values[tree])[-1]
        owed = tuple(vp.vp for vp in self.family.vpeers.values()
                     if vp.attribute == tree and not vp.is_root and not vp.relay
                     and vp.attached and vp.credential.covers(leaf))
        if not owed:
            return
        deals = None
        if self.config.routing == "mcr":
            deals = {v: dict(self.family.vpeers[v].assignment) for v in owed}
        at = now + self.config.gap_wait
        self._checks.append(_Check(at, now, digest, event, owed, leaf, deals=deals))
        self.due(at)
        if self.config.repairs:  # a digest lists an event a digest interval late
            later = at + 2 * self.config.digest_interval
            self._backup_checks.append(_Check(later, now, digest, event, owed, leaf,
                                              backups=True))

    @property
    def pending(self) -> int:
        """Checks not run yet."""
        return len(self._checks) + len(self._backup_checks)

    def timers(self) -> Iterator[Timer]:
        for checks in (self._checks, self._backup_checks):
            if checks:
                yield checks[0].due, 0.0, False, self._run_checks, (checks,)

    def _run_checks(self, checks: deque[_Check], now: float) -> list[Action]:
        out: list[Action] = []
        while checks and checks[0].due <= now:
            check = checks.popleft()
            for vp_id in check.vp_ids:
                vp = self.family.vpeers.get(vp_id)
                if vp is not None and vp.attached:
                    out += (self._check_backups if check.backups else self._check)(
                        vp, check, now)
        return out

    def _check_backups(self, vp: VirtualPeer, check: _Check, now: float) -> list[Action]:
        """The pull repair: a backup covers ``vp``, so it owed a digest entry for the event;
        one that keeps listing none of them (it accepted, then stays silent) is let go,
        and a virtual peer without backups searches for another."""
        out: list[Action] = []
        if vp.backups and not self.dissemination.verified(check.digest, check.event):
            return []  # forged: evidence of nothing
        for node, link in list(vp.backups.items()):
            if link.since + self.config.gap_wait > check.first_at or link.full:
                continue  # (a full digest may have left it out)
            link.gaps.append(check.digest not in link.listed)
            if sum(link.gaps) >= self.config.demote_after:
                del vp.backups[node]
                vp.shunned[node[0]] = now + self.config.shun_period
                self.stats.backups_demoted += 1
                self.due(vp.next_backup_search_at)
                out += [Log("warning", f"{vp.vp}: backup {node[0]} listed none of "
                                       f"{sum(link.gaps)} events it owed, dropped"),
                        Send(node[0], Detach(vp.vp, node[1]))]
        return out

    def _check(self, vp: VirtualPeer, check: _Check, now: float) -> list[Action]:
        """Count a gap or a delivery for each parent that owed ``vp`` the event; demote a
        parent over its limit; take the event for ``vp`` if it never came."""
        owing = self._owing(vp, check)
        missed = [p for p in owing if check.digest not in vp.parents[p].sent]
        if not self.dissemination.verified(check.digest, check.event):
            return []  # forged: evidence of nothing (and once verified, a replay is known)
        out: list[Action] = []
        for parent in owing:
            link = vp.parents[parent]
            link.gaps.append(parent in missed)
            if sum(link.gaps) >= self.config.demote_after:
                out += self._demote(vp, parent, now)
        if not self.dissemination.has_seen(vp, check.digest):
            out += self.dissemination.take_held(vp, check.digest, now) or []
        return out

    def _owing(self, vp: VirtualPeer, check: _Check) -> list[Node]:
        """The remote parents, linked (under MCR: and dealt their tokens) ``gap_wait``
        before the event came and not the tree's root, that owed it: all of them under OHF
        (each covers ``vp``); under MCR those dealt then a token whose fine credential
        encloses the event's leaf."""
        linked = [p for p, link in vp.parents.items()
                  if p[0] != self.family.address and not link.root
                  and max(link.since, link.dealt) + self.config.gap_wait <= check.first_at]
        if check.deals is None:
            return linked
        routing = {raw for keys in vp.keys.values() for raw, fine in keys.dealt
                   if fine.covers(check.leaf)}
        deal = check.deals.get(vp.vp, {})
        return [p for p in linked if routing.intersection(deal.get(p, ()))]

    def _demote(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        self.stats.demoted += 1
        vp.shunned[parent[0]] = now + self.config.shun_period
        return [Log("warning", f"{vp.vp}: parent {parent[0]} missed "
                               f"{sum(vp.parents[parent].gaps)} of the last "
                               f"{len(vp.parents[parent].gaps)} events it owed, replaced"),
                Send(parent[0], Detach(vp.vp, parent[1])),
                *self.lose_parent(vp, parent, now)]
