"""Admitting a peer below a virtual peer: check its connection request, open it with the
virtual peer's token, prove the acceptance, and check such a proof (report 7.2).

Joins, swaps and backups all admit a peer this way; only an opener learns the
requester's position, and only a covering credential opens a request, so an acceptance
proof shows the acceptor covers the requester.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Any

import msgpack

from ibe_pubsub.overlay.crypto import CryptoRejected, CryptoSuite
from ibe_pubsub.overlay.virtual import Node, VirtualPeer
from ibe_pubsub.overlay.wire import Accept


def context(kind: str, acceptor: Node, newcomer: Node) -> bytes:
    """What an acceptance proof is bound to: who accepted whom, and how."""
    return msgpack.packb([kind, *acceptor, *newcomer], use_bin_type=True)


@dataclass(frozen=True)
class Admission:
    """A connection request this peer opened, with what it needs to adopt the requester:
    the SW of the entry that opened (None at a root, which proves by signature) and the
    requester's position, which only an opener learns."""

    request: Any
    sw: bytes | None
    position: int


def check_request(crypto: CryptoSuite, data: bytes, attribute: str, now: float,
                  epochs: Set[int]) -> tuple[Any, str | None]:
    """(request, None) for a valid request of ``attribute``'s tree, else (None, why)."""
    try:
        request = crypto.decode_request(data)
        if crypto.request_attribute(request) != attribute:
            raise CryptoRejected("connection request is for another tree")
        crypto.check_request(request, now, epochs)
    except CryptoRejected as exc:
        return None, str(exc)
    return request, None


def open_request(crypto: CryptoSuite, vp: VirtualPeer, request: Any) -> Admission | None:
    """Open ``request`` with this virtual peer's token of the request's epoch (a root:
    the whole-domain token, which opens every request and proves by signature)."""
    epoch = crypto.request_epoch(request)
    holder = vp.roots.get(epoch) if vp.is_root else vp.keys.get(epoch)
    if holder is None:
        return None
    opening = crypto.open_request(holder.opener, request)
    if opening is None:
        return None
    return Admission(request, None if vp.is_root else opening.sw, opening.position)


def prove(crypto: CryptoSuite, vp: VirtualPeer, admission: Admission, ctx: bytes
          ) -> tuple[bytes, bytes]:
    """(proof, certificate): HMAC under SW, or the root's signature and certificate."""
    request = admission.request
    if admission.sw is not None:
        return crypto.acceptance_proof(admission.sw, request, ctx), b""
    root = vp.roots[max(vp.roots)]
    return crypto.root_proof(root, request, ctx), root.certificate


def proven(crypto: CryptoSuite, address: str, vp: VirtualPeer, frm: Node, m: Accept,
           epoch: int, kind: str, now: float) -> bool:
    """Did ``frm`` prove it opened the request of ``vp`` (at ``address``) of ``epoch`` (so
    its credential covers ours), for a link of ``kind``?"""
    keys = vp.keys.get(epoch)
    if keys is None:
        return False
    request = crypto.decode_request(keys.request)
    ctx = context(kind, frm, (address, vp.vp))
    if m.certificate:
        return crypto.check_root_proof(m.certificate, vp.attribute, request, m.proof, ctx, now)
    return crypto.check_acceptance(keys.sws, request, m.proof, ctx)
