"""Events down the trees (report 7.3-7.4): take an event from a parent, forward it to the
children its routing picks, and deliver it here if it decrypts, matches and verifies.

One physical peer runs many virtual peers, and an event reaches several of them (and
their relays), so the work is shared here: one decode per event, one route test per
(event, token), one decryption per ciphertext, one signature check per event delivered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ibe_pubsub.credentials import Event
from ibe_pubsub.overlay.actions import Action, Deliver, Log, Send
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoRejected, CryptoSuite, SubscriberKit
from ibe_pubsub.overlay.family import Family
from ibe_pubsub.overlay.stats import Stats
from ibe_pubsub.overlay.virtual import Bounded, Node, VirtualPeer
from ibe_pubsub.overlay.wire import EVENT_ID_BYTES, Publish

#: Told of every event a virtual peer takes: (virtual peer, event id, decoded event, now).
Listener = Callable[[VirtualPeer, bytes, Any, float], None]
#: Told of every event this peer decrypts: (the tree it came down, event id, decoded event,
#: plaintext, now).
Opener = Callable[[str, bytes, Any, Event, float], None]


def event_id(data: bytes) -> bytes:
    """The id of an event in digests and duplicate memories: its ciphertext's digest."""
    return hashlib.sha256(data).digest()[:EVENT_ID_BYTES]


class Dissemination:
    """Forwarding and delivery of one physical peer, with its duplicate memories."""

    def __init__(self, crypto: CryptoSuite, config: OverlayConfig, stats: Stats,
                 family: Family, kits: Mapping[int, SubscriberKit], listed: Listener,
                 opened: Opener) -> None:
        self.crypto = crypto
        self.config = config
        self.stats = stats
        self.family = family
        #: The machine's kits by epoch (the same mapping, so rekeys show here).
        self.kits = kits
        #: Where every taken event goes next: the digests for the peers a virtual peer
        #: backs up.
        self.listed = listed
        #: Where every decrypted event goes next: the parents' gap bookkeeping.
        self.opened = opened
        cap = config.dedup_capacity
        self._seen: Bounded[tuple[str, bytes], None] = Bounded(cap)
        self._processed: Bounded[bytes, None] = Bounded(cap)
        self._delivered: Bounded[str, None] = Bounded(cap)
        self._verified: Bounded[bytes, None] = Bounded(cap)
        self._events: Bounded[bytes, Any] = Bounded(64)
        self._routes: Bounded[tuple[bytes, bytes], bool] = Bounded(cap)
        self._tokens: dict[tuple[str, int], Any] = {}
        #: Ciphertexts of recent events by id: what a backup serves pulls from.
        self.raw: Bounded[bytes, bytes] = Bounded(config.repair_memory)

    def has_seen(self, vp: VirtualPeer, digest: bytes) -> bool:
        """Has ``vp`` taken the event of id ``digest`` already?"""
        return (vp.vp, digest) in self._seen

    def forget_epoch(self, epoch: int) -> None:
        """Drop the decoded own tokens of an expired epoch."""
        self._tokens = {k: t for k, t in self._tokens.items() if k[1] != epoch}

    def on_publish(self, vp: VirtualPeer, frm: Node, m: Publish, now: float) -> list[Action]:
        """An event sent to ``vp``: taken only from a parent's peer or from a backup."""
        # Any virtual peer of a parent's peer may send: a relay that a split just moved
        # this child to forwards before the handover arrives. A backup may send only what
        # this peer pulled from it.
        digest = event_id(m.event)
        backup = vp.backups.get(frm)
        pulled = backup is not None and digest in backup.pulled
        if pulled:
            backup.pulled.pop(digest)
        from_parent = (pulled or any(frm[0] == p[0] for p in vp.parents)
                       or vp.former.get(frm[0], -1.0) >= now)
        if (not vp.is_root and not from_parent) or m.attribute != vp.attribute:
            self.stats.drop("not_from_parent")
            return [Log("info", f"{vp.vp}: event from non-parent {frm[0]} or tree dropped")]
        out = self.take(vp, frm[0], digest, m.event, now)
        if (self.config.demote_after and not pulled and not vp.is_root
                and (vp.vp, digest) in self._seen):
            # (only an event that decoded and was taken, in each sender's own record)
            for parent, link in vp.parents.items():
                if parent[0] == frm[0]:
                    link.sent.put(digest, None)
        return out

    def take_held(self, vp: VirtualPeer, digest: bytes, now: float) -> list[Action] | None:
        """Take for ``vp`` an event another of this peer's virtual peers took (None: this
        peer does not hold it)."""
        data = self.raw.get(digest)
        return None if data is None else self.take(vp, self.family.address, digest, data, now)

    def take(self, vp: VirtualPeer, source: str, digest: bytes, data: bytes, now: float
             ) -> list[Action]:
        """An event for ``vp`` (from a parent, a pull, or another tree of this peer): check
        it, forward it down, list it for the peers ``vp`` backs up, and consume it."""
        if (vp.vp, digest) in self._seen:
            return []
        event = self._events.get(digest)
        if event is None:
            try:
                event = self.crypto.decode_event(data)
            except CryptoRejected as exc:
                self.stats.drop("undecodable")
                return [Log("warning", f"{vp.vp}: event from {source} dropped: {exc}")]
            self._events.put(digest, event)
        # Verified before this arrival (a memory only signed events enter, which junk cannot
        # flush): if it comes as new, this peer forgot it, and it is no evidence of a gap.
        replayed = digest in self._verified
        if self.config.verify_before_forward and not self.verified(digest, event):
            self.stats.drop("unverified")
            return [Log("warning", f"{vp.vp}: event from {source} fails verification")]
        self._seen.put((vp.vp, digest), None)
        self.raw.put(digest, data)
        out: list[Action] = []
        for child in self._route(vp, digest, event, now):
            out.append(Send(child[0], Publish(vp.vp, child[1], vp.attribute, data)))
        self.stats.forwarded += len(out)
        self.listed(vp, digest, event, now)
        if not vp.is_root:
            out += self._consume(vp.attribute, digest, event, now, replayed)
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
                if self.family.is_relay(child) or not current or any(
                        self._routes_to(digest, event, raw, t) for raw, t in routing.items()):
                    out.append(child)
            return out
        if not links:
            return []
        if not vp.is_root:
            token = self.own_token(vp, epoch)
            if token is None or not self.crypto.route(token, event):
                return []
        return [child for child, _ in links]

    def _routes_to(self, digest: bytes, event: Any, raw: bytes, token: Any) -> bool:
        known = self._routes.get((digest, raw))
        if known is None:
            known = self.crypto.route(token, event)
            self._routes.put((digest, raw), known)
        return known

    def own_token(self, vp: VirtualPeer, epoch: int) -> Any:
        """``vp``'s own routing token of ``epoch``, decoded once; None if it has none."""
        token = self._tokens.get((vp.vp, epoch))
        if token is None and epoch in vp.keys:
            token = self._tokens[(vp.vp, epoch)] = self.crypto.decode_token(vp.keys[epoch].token)
        return token

    def verified(self, digest: bytes, event: Any) -> bool:
        """Does the publisher's signature hold (checked once per event)?"""
        if digest in self._verified:
            return True
        if not self.crypto.verify(event):
            return False  # forged: remember nothing
        self._verified.put(digest, None)
        return True

    def _consume(self, tree: str, digest: bytes, event: Any, now: float,
                 replayed: bool = False) -> list[Action]:
        """Local delivery: once per ciphertext; decrypt, check the exact predicate, and
        verify only what would be delivered. Decryption is public-key (anyone can encrypt),
        so nothing is delivered unverified; but a false positive, the common case under
        OHF, costs no verification."""
        if digest in self._processed:
            self.stats.duplicates += 1
            return []
        epoch = self.crypto.event_epoch(event)
        kit = self.kits.get(epoch)
        if kit is None:
            return [Log("info", "event of an epoch this peer has no keys for")]
        self._processed.put(digest, None)
        self.stats.received += 1
        plain = self.crypto.decrypt(kit.decrypt_key, event)
        if plain is not None and not replayed:
            self.opened(tree, digest, event, plain, now)
        if plain is None or not kit.predicate.matches(plain.values):
            self.stats.false_positives += 1
            return []
        if not self.verified(digest, event):
            self.stats.forged += 1
            return [Log("warning", "event fails verification, not delivered")]
        if plain.event_id in self._delivered:
            self.stats.duplicates += 1
            self.stats.repeated_ids += 1
            return [Log("info", f"dropped event {plain.event_id!r}: an event of this id was "
                        f"delivered before ({self.stats.repeated_ids} dropped so far)")]
        self._delivered.put(plain.event_id, None)
        self.stats.delivered += 1
        return [Deliver(plain, now, epoch, self.crypto.event_is_stream(event))]
