"""A physical peer's virtual peers, their keys' epochs, and which are relays of which.

A split copies a full virtual peer into a *relay* on the same physical peer (same keys,
one local parent); joins, swaps, pings and events all need to find a virtual peer's
creator and its relays, so that knowledge lives here once.
"""

from __future__ import annotations

import random
from typing import Any

from ibe_pubsub.overlay.crypto import SubscriberKit
from ibe_pubsub.overlay.virtual import Bounded, Node, VirtualPeer


class Family:
    """The virtual peers of the physical peer at ``address``, by id."""

    def __init__(self, address: str, rng: random.Random, repair_memory: int) -> None:
        self.address = address
        self.rng = rng
        self.repair_memory = repair_memory
        self.vpeers: dict[str, VirtualPeer] = {}
        self.kits: dict[int, SubscriberKit] = {}
        #: creator virtual peer id -> its relays, breadth first (see :meth:`relays`)
        self._relay_lists: dict[str, list[VirtualPeer]] = {}

    def add(self, attribute: str, credential: Any, vp_id: str | None = None) -> VirtualPeer:
        """A new virtual peer (a random id unless given)."""
        vp = VirtualPeer(vp=vp_id or self.rng.randbytes(6).hex(), attribute=attribute,
                         credential=credential, tested=Bounded(self.repair_memory))
        self.vpeers[vp.vp] = vp
        return vp

    def install(self, kit: SubscriberKit) -> list[VirtualPeer]:
        """Add a kit's keys to the matching virtual peers; returns the ones it created."""
        self.kits[kit.epoch] = kit
        created = []
        for keys in kit.virtuals:
            mine = [v for v in self.vpeers.values()
                    if not v.is_root and v.credential == keys.credential]
            if not mine:
                mine = [self.add(keys.credential.attribute, keys.credential)]
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
        """The newest epoch: the one joins and backup requests use."""
        return max(self.epochs, default=0)

    def creator(self, vp: VirtualPeer) -> VirtualPeer:
        """The virtual peer a relay is a copy of (itself if it is no relay)."""
        parent = next(iter(vp.parents), ("", ""))
        while vp.relay and parent[0] == self.address:
            vp = self.vpeers[parent[1]]
            parent = next(iter(vp.parents), ("", ""))
        return vp

    def relays(self, vp: VirtualPeer) -> list[VirtualPeer]:
        """The relays below ``vp``, breadth first (they are all local; only a split adds
        one, so the list is kept until the next split)."""
        queue = self._relay_lists.get(vp.vp)
        if queue is None:
            queue = [self.vpeers[c[1]] for c in vp.children if self.is_relay(c)]
            for relay in queue:
                queue += [self.vpeers[c[1]] for c in relay.children if self.is_relay(c)]
            self._relay_lists[vp.vp] = queue
        return queue

    def forget_relays(self, vp_id: str | None = None) -> None:
        """Drop the kept relay list of ``vp_id`` (of every virtual peer: None)."""
        if vp_id is None:
            self._relay_lists.clear()
        else:
            self._relay_lists.pop(vp_id, None)

    def is_relay(self, node: Node) -> bool:
        """Relays are this peer's own copies: they get whatever their parent got."""
        relay = self.vpeers.get(node[1]) if node[0] == self.address else None
        return relay is not None and relay.relay

    def link_holder(self, vp: VirtualPeer, child: Node) -> VirtualPeer | None:
        """The virtual peer that holds the link to ``child``: ``vp`` or, after a split moved
        the child, the relay of ``vp``'s family that took it (the child may still address
        ``vp`` until the handover reaches it)."""
        creator = self.creator(vp)
        return next((r for r in (vp, creator, *self.relays(creator)) if child in r.children),
                    None)
