"""Repair against peers that drop events: backups, digests and pulls.

Every subscriber virtual peer asks a covering ancestor beyond its parent to be its
*backup* (see ``OverlayConfig.repair``). A backup lists to its *watchers* the ids of
events that reached it a while ago, each with the route entry at the watcher's position;
the watcher tests the entries of ids it lacks with its own token (no token leaves it)
and pulls the ones that match. Backup and watcher admit each other as parent and child
do (:mod:`overlay.admission`), and every step is bounded, so a hostile peer on either
end can cost the other only a few route tests per digest interval.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ibe_pubsub.overlay.actions import Action, Log, Send
from ibe_pubsub.overlay.admission import check_request, context, open_request, prove, proven
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoRejected, CryptoSuite
from ibe_pubsub.overlay.dissemination import Dissemination
from ibe_pubsub.overlay.family import Family
from ibe_pubsub.overlay.stats import Stats
from ibe_pubsub.overlay.timers import Timer
from ibe_pubsub.overlay.virtual import BackupLink, Bounded, Node, VirtualPeer, WatchLink
from ibe_pubsub.overlay.wire import Accept, Detach, Digest, Publish, Pull, Watch

#: A virtual peer pings its backups every this many heartbeats (they are a second path,
#: so detecting their failure can wait; it saves most of their heartbeat messages).
BACKUP_HEARTBEATS = 3


class Repair:
    """The backups and watchers of one physical peer's virtual peers."""

    def __init__(self, crypto: CryptoSuite, config: OverlayConfig, rng: random.Random,
                 stats: Stats, family: Family, dissemination: Dissemination,
                 due: Callable[[float], None]) -> None:
        self.crypto = crypto
        self.config = config
        self.rng = rng
        self.stats = stats
        self.family = family
        self.address = family.address
        self.dissemination = dissemination
        #: Tells the machine a timer may fall due then (see ``PeerMachine.next_tick_at``).
        self.due = due

    @property
    def backup_timeout(self) -> float:
        """Backups are pinged every ``BACKUP_HEARTBEATS``-th heartbeat, so a backup link is
        taken for failed after that many failure timeouts."""
        return BACKUP_HEARTBEATS * self.config.failure_timeout

    def ancestor(self, vp: VirtualPeer) -> Node:
        """The nearest remote parent of this virtual peer (of the one it copies, for a
        relay): what a child may ask to be its backup. ("", "") for the tree's top."""
        creator = self.family.creator(vp)
        return next((p for p in creator.parents if p[0] != self.address), ("", ""))

    def ask_backup(self, vp: VirtualPeer, ancestor: Node, now: float) -> list[Action]:
        """Ask an ancestor a parent or backup named to back this virtual peer up, if it
        needs one more. Under OHF never a peer that is a parent of it: a backup can learn
        the exact credential (see ``OverlayConfig.repairs``), which an OHF parent does not
        know; an MCR parent knows it from the fine tokens, and may be a parent for some of
        them and a backup for those a dropping parent withholds."""
        if (not self.config.repairs or vp.relay or not ancestor[0]
                or len(vp.backups) + len(vp.watch_asks) >= self.config.backups):
            return []
        keys = vp.keys.get(self.family.epoch)
        linked = {self.address, *(n[0] for n in vp.backups), *self._parent_peers(vp),
                  *(n[0] for n, _ in vp.watch_asks.values())}
        if keys is None or ancestor[0] in linked or vp.shunned.get(ancestor[0], -1.0) > now:
            return []
        join_id = self.rng.randbytes(16)
        vp.watch_asks[join_id] = (ancestor, now)
        self.due(now + 2 * self.config.join_timeout)
        return [Send(ancestor[0], Watch(vp.vp, ancestor[1], join_id, keys.request))]

    def on_watch(self, vp: VirtualPeer, frm: Node, m: Watch, now: float) -> list[Action]:
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
        request, error = check_request(self.crypto, m.request, vp.attribute, now,
                                       self.family.epochs)
        admission = open_request(self.crypto, vp, request) if error is None else None
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
        self.due(now + self.backup_timeout)
        proof, cert = prove(self.crypto, vp, admission,
                            context("watch", (self.address, vp.vp), frm))
        return [Send(frm[0], Accept(vp.vp, frm[1], m.join_id, proof, cert))]

    def on_watch_accept(self, vp: VirtualPeer, frm: Node, m: Accept, now: float
                        ) -> list[Action]:
        """An ancestor asked to back ``vp`` up proved it covers it: a new backup link."""
        asked, _ = vp.watch_asks[m.join_id]
        if asked != frm or not proven(self.crypto, self.address, vp, frm, m,
                                      self.family.epoch, "watch", now):
            return [Log("warning", f"{vp.vp}: watch accept from {frm[0]} with a bad proof")]
        del vp.watch_asks[m.join_id]
        if len(vp.backups) >= self.config.backups or frm[0] in self._parent_peers(vp):
            return [Send(frm[0], Detach(vp.vp, frm[1]))]
        vp.backups[frm] = BackupLink(now, Bounded(self.config.repair_memory), since=now,
                                     listed=Bounded(self.config.dedup_capacity),
                                     gaps=deque(maxlen=self.config.demote_window))
        self.due(min(vp.next_ping_at, now + self.backup_timeout))
        return []

    def on_new_parent(self, vp: VirtualPeer, parent: Node) -> list[Action]:
        """OHF: a backup on the peer of a new parent stops being one (see
        :meth:`ask_backup`)."""
        if parent[0] not in self._parent_peers(vp):
            return []
        gone = [node for node in vp.backups if node[0] == parent[0]]
        for node in gone:
            del vp.backups[node]
        self.due(vp.next_backup_search_at)  # the backup search may be due now
        return [Send(node[0], Detach(vp.vp, node[1])) for node in gone]

    def _parent_peers(self, vp: VirtualPeer) -> set[str]:
        """The physical peers that may not back ``vp`` up: its parents', under OHF."""
        return {p[0] for p in vp.parents} if self.config.routing == "ohf" else set()

    def backup_timers(self, vp: VirtualPeer) -> Iterator[Timer]:
        """Silent backups are dropped; unanswered asks are forgotten."""
        for node, link in list(vp.backups.items()):
            yield (link.last_heard, self.backup_timeout, True, self._drop,
                   (vp.backups, vp, node, "backup"))
        for join_id, (_, asked) in list(vp.watch_asks.items()):
            yield asked, 2 * self.config.join_timeout, True, _forget, (vp.watch_asks, join_id)

    def watcher_timers(self, vp: VirtualPeer) -> Iterator[Timer]:
        """Silent watchers are dropped; then the digests go out when due."""
        for node, link in list(vp.watchers.items()):
            yield (link.last_heard, self.backup_timeout, True, self._drop,
                   (vp.watchers, vp, node, "watcher"))
        due = self._digests_due(vp)  # read after the drops above
        if due is not None:
            yield due, 0.0, False, self._send_digests, (vp,)

    @staticmethod
    def _drop(links: dict[Node, Any], vp: VirtualPeer, node: Node, kind: str, now: float
              ) -> list[Action]:
        del links[node]
        return [Log("info", f"{vp.vp}: {kind} {node[0]} silent, dropped")]

    def list_for_watchers(self, vp: VirtualPeer, digest: bytes, event: Any, now: float
                          ) -> None:
        """Note an event for the digests of every peer ``vp`` backs up, with what the
        watcher's route test at its position reads: ``vp`` holds no token of theirs, so it
        lists all it takes (a watcher's credential is inside ``vp``'s)."""
        for link in vp.watchers.values():
            entry = self.crypto.digest_entry(event, vp.attribute, link.position)
            link.pending.append((now, digest, entry))
            del link.pending[:-self.config.digest_entries]
        if vp.watchers:
            self.due(self._digests_due(vp) or now)

    def _digests_due(self, vp: VirtualPeer) -> float | None:
        """When ``vp`` next sends digests: once an event waited ``digest_interval`` (its copy
        down the tree has had time to arrive), at most every ``digest_interval``."""
        oldest = [link.pending[0][0] for link in vp.watchers.values() if link.pending]
        if not oldest:
            return None
        return max(vp.next_digest_at, min(oldest) + self.config.digest_interval)

    def _send_digests(self, vp: VirtualPeer, now: float) -> list[Action]:
        cfg = self.config
        out: list[Action] = []
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

    def on_digest(self, vp: VirtualPeer, frm: Node, m: Digest, now: float) -> list[Action]:
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
        backup.full = len(m.ids) >= self.config.digest_entries
        for digest in m.ids:  # (what it listed counts even in a digest dropped below)
            backup.listed.put(digest, None)
        if now < backup.next_digest_at:  # a backup sends one per digest_interval
            self.stats.drop("digest_too_soon")
            return [Log("warning", f"{vp.vp}: digest from {frm[0]} too soon, dropped")]
        backup.next_digest_at = now + self.config.digest_interval / 2
        out: list[Action] = []
        wanted = []
        for digest, entry in zip(m.ids, m.entries, strict=True):
            if self.dissemination.has_seen(vp, digest) or not self._wants(vp, entry):
                continue
            held = self.dissemination.take_held(vp, digest, now)
            if held is not None:
                out += held
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
                known = any(self.crypto.route_entry(self.dissemination.own_token(vp, e), entry)
                            for e in sorted(vp.keys))
            except CryptoRejected:
                known = False
            vp.tested.put(entry, known)
        return known

    def on_pull(self, vp: VirtualPeer, frm: Node, m: Pull, now: float) -> list[Action]:
        """Serve each id once, and only ids listed to this watcher and still held: a pull
        costs at most the events its digests listed, however often it is sent."""
        link = vp.watchers.get(frm)
        if link is None:
            self.stats.drop("pull_from_non_watcher")
            return [Log("info", f"{vp.vp}: pull from non-watcher {frm[0]} refused")]
        out: list[Action] = []
        for digest in m.ids:
            data = self.dissemination.raw.get(digest) if digest in link.offered else None
            if data is not None:
                link.offered.pop(digest)
                out.append(Send(frm[0], Publish(vp.vp, frm[1], vp.attribute, data)))
        refused = len(m.ids) - len(out)
        if refused:
            self.stats.pulls_refused += refused
            out.append(Log("info", f"{vp.vp}: {refused} pulled ids from {frm[0]} refused"))
        return out


def _forget(asks: dict[bytes, Any], join_id: bytes, now: float) -> list[Action]:
    del asks[join_id]
    return []
