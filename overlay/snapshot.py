"""A physical peer's place in the containment trees, read off its state machine.

Shared by the running peer's ``/status`` and by the tree picture of a simulated run, so
both show the same thing. A virtual peer is listed with its credential's *position* (the
length of the credential's prefix, 0 for the whole domain), never the credential: a
parent learns a child's position anyway when it opens the child's connection request,
and the links already show who covers whom, so the position adds nothing a neighbour
does not know, while the credential would reveal the subscription.
"""

from __future__ import annotations

from typing import Any

from ibe_pubsub.overlay.machine import PeerMachine
from ibe_pubsub.overlay.virtual import Node, VirtualPeer


def _ends(nodes: dict[Node, Any]) -> list[dict[str, str]]:
    return [{"address": address, "vp": vp} for address, vp in sorted(nodes)]


def _depth(machine: PeerMachine, vp: VirtualPeer) -> int | None:
    """The virtual peer's depth; a relay (whose parent is on this peer, so never answers
    it a depth over the network) sits one below its parent here."""
    depth = vp.depth
    for node in vp.parents if depth is None else ():
        local = machine.vpeers.get(node[1]) if node[0] == machine.address else None
        above = _depth(machine, local) if local is not None and local is not vp else None
        if above is not None:
            depth = max(depth or 0, above + 1)
    return depth


def virtual_peer_status(machine: PeerMachine, vp: VirtualPeer) -> dict[str, Any]:
    """One virtual peer: position, links, out-degree and depth."""
    return {"vp": vp.vp, "position": vp.credential.position, "root": vp.is_top,
            "relay": vp.relay, "attached": vp.attached, "depth": _depth(machine, vp),
            "parents": _ends(vp.parents), "children": _ends(vp.children),
            "out_degree": len(vp.children)}


def tree_status(machine: PeerMachine) -> dict[str, dict[str, Any]]:
    """Per attribute tree: this peer's virtual peers (relays included) and its links."""
    trees: dict[str, dict[str, Any]] = {}
    for vp in sorted(machine.vpeers.values(), key=lambda v: (v.attribute, v.vp)):
        tree = trees.setdefault(vp.attribute, {"virtual_peers": [], "links": 0, "relays": 0})
        tree["virtual_peers"].append(virtual_peer_status(machine, vp))
        tree["links"] += sum(1 for n in (*vp.parents, *vp.children) if n[0] != machine.address)
        tree["relays"] += vp.relay
    return trees
