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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from overlay.actions import Action, Connected, Deliver, Log, Send
from overlay.config import OverlayConfig
from overlay.crypto import CryptoRejected, CryptoSuite, RootKit, SubscriberKit
from overlay.virtual import (
    Bounded,
    ChildLink,
    Node,
    ParentLink,
    PendingJoin,
    SwapOffered,
    VirtualPeer,
)
from overlay.wire import (
    Accept,
    Detach,
    Handover,
    Join,
    Message,
    Ping,
    Pong,
    Publish,
    SwapAccept,
    SwapHandover,
    SwapOffer,
    Tokens,
    WireError,
    decode,
)


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


@dataclass
class _Opened:
    """A request this peer opened (kept so a swap handover can accept the newcomer)."""

    vp: str
    newcomer: Node
    sw: bytes | None
    request: Any


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
        self.stats = Stats()
        self.stopped = False
        self._expiry: dict[int, float] = {}
        cap = config.dedup_capacity
        self._seen_joins: Bounded[tuple[str, bytes], None] = Bounded(cap)
        self._opened: Bounded[bytes, _Opened] = Bounded(cap)
        self._seen_events: Bounded[tuple[str, bytes], None] = Bounded(cap)
        self._processed: Bounded[bytes, None] = Bounded(cap)
        self._delivered: Bounded[str, None] = Bounded(cap)
        self._verified: Bounded[bytes, None] = Bounded(cap)
        self._tokens: dict[tuple[str, int], Any] = {}
        for root in roots:
            vp = self._new_vpeer(root.attribute, root.credential)
            vp.roots[root.epoch] = root
        if kit is not None:
            self._install_kit(kit)
        self._handlers: dict[type[Message], Callable[..., list[Action]]] = {
            Join: self._on_join, Accept: self._on_accept, Detach: self._on_detach,
            SwapOffer: self._on_swap_offer, SwapAccept: self._on_swap_accept,
            SwapHandover: self._on_swap_handover, Tokens: self._on_tokens, Ping: self._on_ping,
            Pong: self._on_pong, Handover: self._on_handover, Publish: self._on_publish}

    # -- set-up and user operations -----------------------------------------------------------

    def _new_vpeer(self, attribute: str, credential: Any) -> VirtualPeer:
        vp = VirtualPeer(vp=self.rng.randbytes(6).hex(), attribute=attribute,
                         credential=credential)
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
            found.update(vp.roots)
        return found

    @property
    def epoch(self) -> int:
        return max(self.epochs, default=0)

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
            heir = next(iter(vp.parents), ("", ""))
            for child in vp.children:
                out.append(Send(child[0], Handover(vp.vp, child[1], heir[0], heir[1])))
            for parent in vp.parents:
                out.append(Send(parent[0], Detach(vp.vp, parent[1])))
            vp.children.clear()
            vp.parents.clear()
        self.stopped = True
        return out

    def rekey(self, now: float, kit: SubscriberKit | None = None,
              roots: Sequence[RootKit] = ()) -> list[Action]:
        """Install the keys of a new epoch; the older epochs stay valid for the grace period."""
        out: list[Action] = []
        for old in self.epochs:
            self._expiry.setdefault(old, now + self.config.grace)
        for root in roots:
            for vp in self.vpeers.values():
                if vp.is_root and vp.attribute == root.attribute:
                    vp.roots[root.epoch] = root
        if kit is not None:
            for vp in self._install_kit(kit):
                vp.join_started = now
                out += self._send_join(vp, now)
        if self.config.routing == "mcr":
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
        for vp in self.vpeers.values():
            for child, link in list(vp.children.items()):
                if now - link.last_heard > cfg.failure_timeout:
                    del vp.children[child]
                    out.append(Log("info", f"{vp.vp}: child {child[0]} silent, dropped"))
            if vp.is_top:
                continue
            lost = [p for p, link in vp.parents.items()
                    if now - link.last_heard > cfg.failure_timeout]
            for parent in lost:
                out.append(Log("info", f"{vp.vp}: parent {parent[0]} silent, rejoining"))
                out += self._lose_parent(vp, parent, now)
            if now >= vp.next_ping_at:
                vp.next_ping_at = now + cfg.heartbeat_interval
                out += [Send(p[0], Ping(vp.vp, p[1])) for p in vp.parents]
            for join_id, pending in list(vp.joins.items()):
                if now - pending.sent_at > 2 * cfg.join_timeout:
                    del vp.joins[join_id]
            joining = vp.join_started is not None or vp.parents
            if joining and len(vp.parents) < self._wanted_links(vp) and now >= vp.next_join_at:
                if vp.parents and vp.link_attempts >= cfg.mcr_link_attempts:
                    continue
                hint, vp.split_hint = vp.split_hint, None
                out += self._send_join(vp, now, hint if not vp.parents else None, bool(hint))
        return out

    def _drop_epoch(self, epoch: int) -> None:
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
        if target is None:
            candidates = self.contacts.get(vp.attribute, [])
            if not candidates:
                return [Log("warning", f"{vp.vp}: no contact for tree {vp.attribute!r}")]
            target = (self.rng.choice(candidates), "")
        join_id = self.rng.randbytes(16)
        vp.joins[join_id] = PendingJoin(now, self.epoch)
        vp.next_join_at = now + self.config.join_timeout
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

    def _open(self, vp: VirtualPeer, request: Any) -> tuple[bool, bytes | None]:
        """(opened, SW): a root opens everything without an SW."""
        if vp.is_root:
            return True, None
        epoch = getattr(request, "epoch", None)
        keys = vp.keys.get(epoch) if isinstance(epoch, int) else None
        if keys is None:
            return False, None
        sw = self.crypto.open_request(keys, request)
        return sw is not None, sw

    def _prove(self, vp: VirtualPeer, sw: bytes | None, request: Any, ctx: bytes
               ) -> tuple[bytes, bytes]:
        """(proof, certificate): HMAC under SW, or the root's signature and certificate."""
        if sw is not None:
            return self.crypto.acceptance_proof(sw, request, ctx), b""
        root = vp.roots[max(vp.roots)]
        return self.crypto.root_proof(root, request, ctx), root.certificate

    def _on_join(self, vp: VirtualPeer, frm: Node, m: Join, now: float) -> list[Action]:
        if m.origin == self.address or (vp.vp, m.join_id) in self._seen_joins:
            return []
        if m.hops <= 0 or m.attribute != vp.attribute:
            return [Log("debug", f"{vp.vp}: join {m.join_id.hex()[:8]} out of hops or tree")]
        request, error = self._check_request(m.request, vp.attribute, now)
        if error is not None:
            return [Log("warning", f"join from {frm[0]} dropped: {error}")]
        self._seen_joins.put((vp.vp, m.join_id), None)
        newcomer = (m.origin, m.origin_vp)
        opened, sw = self._open(vp, request)
        forward = Join(vp.vp, "", m.attribute, m.join_id, m.origin, m.origin_vp, m.hops - 1,
                       m.request, False, m.depth)
        if opened:
            self._opened.put(m.join_id, _Opened(vp.vp, newcomer, sw, request))
            # An attached newcomer looks for a further parent (MCR): only strictly shallower
            # peers qualify, which rules out its own descendants and so any cycle.
            fresh = (vp.attached and newcomer not in vp.children and newcomer not in vp.parents
                     and (m.depth < 0 or _depth(vp) in range(m.depth)))
            if fresh and len(vp.children) < self.config.max_children:
                return self._adopt(vp, newcomer, m.join_id, sw, request, now)
            relay = self._free_relay(vp) if fresh else None
            if relay is not None:
                return self._adopt(relay, newcomer, m.join_id, sw, request, now)
            if fresh and m.split and self.config.max_children >= 2:
                return self._split(vp, newcomer, m.join_id, sw, request, now)
            # A further-parent search only looks at peers shallower than the newcomer.
            below = m.depth < 0 or _depth(vp) + 1 < m.depth
            targets = [n for n in (*(vp.children if below else ()), *vp.parents) if n != frm]
        elif m.depth >= 0:
            targets = [] if frm in vp.parents else list(vp.parents)
        elif frm in vp.parents:
            keys = vp.keys.get(getattr(request, "epoch", -1))
            if keys is None:
                return []
            vp.swaps[m.join_id] = SwapOffered(frm, newcomer, request.epoch)
            return [Send(m.origin, SwapOffer(vp.vp, m.origin_vp, m.join_id, keys.request, *frm))]
        else:
            targets = list(vp.parents)
        return [Send(n[0], _retarget(forward, n[1])) for n in targets]

    def _adopt(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, sw: bytes | None,
               request: Any, now: float) -> list[Action]:
        vp.children[newcomer] = ChildLink(now)
        proof, cert = self._prove(vp, sw, request, context("join", (self.address, vp.vp),
                                                           newcomer))
        return [Send(newcomer[0], Accept(vp.vp, newcomer[1], join_id, proof, cert))]

    def _free_relay(self, vp: VirtualPeer) -> VirtualPeer | None:
        """A relay below ``vp`` (breadth first, local only) with a free child slot."""
        queue = [self.vpeers[c[1]] for c in vp.children if self._is_relay(c)]
        for relay in queue:
            if len(relay.children) < self.config.max_children:
                return relay
            queue += [self.vpeers[c[1]] for c in relay.children if self._is_relay(c)]
        return None

    def _split(self, vp: VirtualPeer, newcomer: Node, join_id: bytes, sw: bytes | None,
               request: Any, now: float) -> list[Action]:
        """A full peer that covers the newcomer but none of whose children does: a relay
        copy of this virtual peer takes one child's slot, that child and the newcomer."""
        relay = self._new_vpeer(vp.attribute, vp.credential)
        relay.keys, relay.roots, relay.relay = dict(vp.keys), dict(vp.roots), True
        relay.parents[(self.address, vp.vp)] = ParentLink(now, vp.depth)
        peers = sorted(c for c in vp.children if not self._is_relay(c))
        moved = self.rng.choice(peers or sorted(vp.children))
        del vp.children[moved]
        vp.children[(self.address, relay.vp)] = ChildLink(now)
        out: list[Action] = [Log("info", f"{vp.vp}: full, split off relay {relay.vp}")]
        if self._is_relay(moved):  # a local relay moves down without any message
            below = self.vpeers[moved[1]]
            below.parents = {(self.address, relay.vp): ParentLink(now)}
            relay.children[moved] = ChildLink(now)
        else:
            out.append(Send(moved[0], Handover(vp.vp, moved[1], self.address, relay.vp)))
        return out + self._adopt(relay, newcomer, join_id, sw, request, now)

    def _on_accept(self, vp: VirtualPeer, frm: Node, m: Accept, now: float) -> list[Action]:
        pending = vp.joins.get(m.join_id)
        keys = vp.keys.get(pending.epoch) if pending else None
        if pending is None or keys is None:
            return [Log("info", f"{vp.vp}: accept from {frm[0]} for no pending join, ignored")]
        request = self.crypto.decode_request(keys.request)
        ctx = context("join", frm, (self.address, vp.vp))
        if m.certificate:
            ok = self.crypto.check_root_proof(m.certificate, vp.attribute, request, m.proof,
                                              ctx, now)
        else:
            ok = self.crypto.check_acceptance(keys.sws, request, m.proof, ctx)
        if not ok:
            return [Log("warning", f"{vp.vp}: accept from {frm[0]} with a bad proof dropped")]
        if (frm[0] == self.address or frm in vp.parents or frm in vp.children
                or len(vp.parents) >= self._wanted_links(vp)):
            return [Send(frm[0], Detach(vp.vp, frm[1]))]
        return self._add_parent(vp, frm, now)

    def _add_parent(self, vp: VirtualPeer, parent: Node, now: float) -> list[Action]:
        vp.parents[parent] = ParentLink(now)
        started = vp.join_started if vp.join_started is not None else now
        if len(vp.parents) >= self._wanted_links(vp):
            vp.join_started = None
        out: list[Action] = [Connected(vp.attribute, vp.vp, parent[0], len(vp.parents),
                                       started, now)]
        return out + self._assign_tokens(vp)

    def _assign_tokens(self, vp: VirtualPeer) -> list[Action]:
        """MCR: deal the fine tokens (of every valid epoch) round-robin over the parents, so
        with enough parents each fine credential's token goes to a different parent."""
        if self.config.routing != "mcr" or vp.relay or vp.is_root or not vp.parents:
            return []
        parents = list(vp.parents)
        dealt: dict[Node, list[bytes]] = {p: [] for p in parents}
        for epoch in sorted(vp.keys):
            keys = vp.keys[epoch]
            for i, token in enumerate(keys.fine_tokens or (keys.token,)):
                dealt[parents[i % len(parents)]].append(token)
        out: list[Action] = []
        for p in parents:
            tokens = tuple(dealt[p])
            if vp.assignment.get(p) != tokens:
                vp.assignment[p] = tokens
                out.append(Send(p[0], Tokens(vp.vp, p[1], tokens)))
        return out

    # -- swaps (Algorithm 2, line 9) -----------------------------------------------------------

    def _on_swap_offer(self, vp: VirtualPeer, frm: Node, m: SwapOffer, now: float
                       ) -> list[Action]:
        if m.join_id not in vp.joins or vp.parents or frm in vp.children:
            return [Log("debug", f"{vp.vp}: swap offer from {frm[0]} not wanted")]
        request, error = self._check_request(m.request, vp.attribute, now)
        if error is not None:
            return [Log("warning", f"swap offer from {frm[0]} dropped: {error}")]
        opened, sw = self._open(vp, request)
        if not opened or sw is None or len(vp.children) >= self.config.max_children:
            vp.split_hint = (m.parent, m.parent_vp)
            return [Log("debug", f"{vp.vp}: swap offer from {frm[0]} not taken")]
        vp.children[frm] = ChildLink(now)
        proof = self.crypto.acceptance_proof(sw, request, context("swap", (self.address, vp.vp),
                                                                  frm))
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
        out: list[Action] = [Send(offer.old_parent[0], SwapHandover(vp.vp, offer.old_parent[1],
                                                                    m.join_id))]
        if frm in vp.parents:
            return out + self._assign_tokens(vp)
        return out + self._add_parent(vp, frm, now)

    def _on_swap_handover(self, vp: VirtualPeer, frm: Node, m: SwapHandover, now: float
                          ) -> list[Action]:
        if frm not in vp.children:
            return [Log("info", f"{vp.vp}: swap handover from non-child {frm[0]} ignored")]
        del vp.children[frm]
        opened = self._opened.get(m.join_id)
        if (opened is None or opened.vp != vp.vp or opened.newcomer in vp.children
                or not vp.attached):
            return [Log("debug", f"{vp.vp}: {frm[0]} swapped away, its newcomer not taken")]
        return self._adopt(vp, opened.newcomer, m.join_id, opened.sw, opened.request, now)

    # -- links -------------------------------------------------------------------------------

    def _on_detach(self, vp: VirtualPeer, frm: Node, m: Detach, now: float) -> list[Action]:
        if vp.children.pop(frm, None) is None:
            return [Log("debug", f"{vp.vp}: detach from non-child {frm[0]} ignored")]
        return []

    def _on_tokens(self, vp: VirtualPeer, frm: Node, m: Tokens, now: float) -> list[Action]:
        child = vp.children.get(frm)
        if child is None:
            return [Log("info", f"{vp.vp}: tokens from non-child {frm[0]} ignored")]
        try:
            tokens = tuple(self.crypto.decode_token(t) for t in m.tokens)
        except CryptoRejected as exc:
            return [Log("warning", f"{vp.vp}: tokens from {frm[0]} dropped: {exc}")]
        child.tokens = tokens
        return []

    def _on_ping(self, vp: VirtualPeer, frm: Node, m: Ping, now: float) -> list[Action]:
        child = vp.children.get(frm)
        if child is not None:
            child.last_heard = now
        return [Send(frm[0], Pong(vp.vp, frm[1], child is not None, _depth(vp)))]

    def _on_pong(self, vp: VirtualPeer, frm: Node, m: Pong, now: float) -> list[Action]:
        link = vp.parents.get(frm)
        if link is None:
            return [Log("debug", f"{vp.vp}: pong from non-parent {frm[0]} ignored")]
        if not m.ok:
            return [Log("info", f"{vp.vp}: parent {frm[0]} dropped us, rejoining"),
                    *self._lose_parent(vp, frm, now)]
        link.last_heard = now
        link.depth = None if m.depth < 0 else m.depth
        depth = vp.depth
        if depth is not None and depth > self.config.max_depth:
            out: list[Action] = [Log("warning", f"{vp.vp}: depth {depth}, assuming a loop")]
            for parent in list(vp.parents):
                out.append(Send(parent[0], Detach(vp.vp, parent[1])))
                out += self._lose_parent(vp, parent, now)
            return out
        return []

    def _on_handover(self, vp: VirtualPeer, frm: Node, m: Handover, now: float
                     ) -> list[Action]:
        if frm not in vp.parents:
            return [Log("info", f"{vp.vp}: handover from non-parent {frm[0]} ignored")]
        out = self._lose_parent(vp, frm, now)
        target = (m.new_parent, m.new_parent_vp) if m.new_parent else None
        return out + self._send_join(vp, now, target)

    # -- events ------------------------------------------------------------------------------

    def _on_publish(self, vp: VirtualPeer, frm: Node, m: Publish, now: float) -> list[Action]:
        if (not vp.is_root and frm not in vp.parents) or m.attribute != vp.attribute:
            self.stats.dropped += 1
            return [Log("info", f"{vp.vp}: event from non-parent {frm[0]} or tree dropped")]
        digest = hashlib.sha256(m.event).digest()[:16]
        if (vp.vp, digest) in self._seen_events:
            return []
        try:
            event = self.crypto.decode_event(m.event)
        except CryptoRejected as exc:
            self.stats.dropped += 1
            return [Log("warning", f"{vp.vp}: event from {frm[0]} dropped: {exc}")]
        if self.config.verify_before_forward and not self._verify(digest, event):
            self.stats.dropped += 1
            return [Log("warning", f"{vp.vp}: event from {frm[0]} fails verification")]
        self._seen_events.put((vp.vp, digest), None)
        out: list[Action] = []
        for child in self._route(vp, event):
            out.append(Send(child[0], Publish(vp.vp, child[1], vp.attribute, m.event)))
        self.stats.forwarded += len(out)
        if not vp.is_root:
            out += self._consume(digest, event, now)
        return out

    def _route(self, vp: VirtualPeer, event: Any) -> Iterable[Node]:
        """OHF: every child if this peer's own token matches (roots: always);
        MCR: each child whose tokens match."""
        epoch = self.crypto.event_epoch(event)
        if self.config.routing == "mcr":
            return [c for c, link in vp.children.items() if self._is_relay(c) or any(
                self.crypto.token_epoch(t) == epoch and self.crypto.route(t, event)
                for t in link.tokens)]
        if not vp.children:
            return []
        if vp.is_root:
            return list(vp.children)
        token = self._own_token(vp, epoch)
        if token is None or not self.crypto.route(token, event):
            return []
        return list(vp.children)

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
        """Local delivery: once per ciphertext; verify, decrypt, check the exact predicate."""
        if digest in self._processed:
            self.stats.duplicates += 1
            return []
        kit = self.kits.get(self.crypto.event_epoch(event))
        if kit is None:
            return [Log("info", "event of an epoch this peer has no keys for")]
        if not self._verify(digest, event):
            return [Log("warning", "event fails verification, not delivered")]
        self._processed.put(digest, None)
        self.stats.received += 1
        plain = self.crypto.decrypt(kit.decrypt_key, event)
        if plain is None or not kit.predicate.matches(plain.values):
            self.stats.false_positives += 1
            return []
        if plain.event_id in self._delivered:
            self.stats.duplicates += 1
            return []
        self._delivered.put(plain.event_id, None)
        self.stats.delivered += 1
        return [Deliver(plain, now)]

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


def _retarget(m: Join, dst_vp: str) -> Join:
    return Join(m.src_vp, dst_vp, m.attribute, m.join_id, m.origin, m.origin_vp, m.hops,
                m.request, m.split, m.depth)


def _depth(vp: VirtualPeer) -> int:
    depth = vp.depth
    return -1 if depth is None else depth

