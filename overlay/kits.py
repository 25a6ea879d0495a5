"""Which of a subscriber's credentials become virtual peers, and the kit that gives each one
its keys.

A subscriber holds keys for every credential of its subscription, but it joins only the
trees its subscription constrains: one virtual peer per credential that is not a
whole-domain one, or, for a subscription that constrains nothing, the first attribute's
whole-domain credential (it must join some tree to receive events). Under multi-credential
routing each virtual peer hands its parents the fine tokens it covers. The peer (keys from
the key server) and the simulator's issuers (keys made locally) both plan with
:func:`plan_virtual_peers`, and both build real kits with :func:`real_kit`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ibe_pubsub.credentials import (
    Credential,
    EventFilter,
    Schema,
    SubscriberKey,
    codec,
    virtual_peer_credentials,
)
from ibe_pubsub.overlay.crypto import SubscriberKit, VirtualKeys

#: [(a virtual peer's credential, the fine credentials it covers)]
Plan = list[tuple[Credential, tuple[Credential, ...]]]

#: A credential's signed connection request (encoded) and its SW per position.
RequestOf = Callable[[Credential], tuple[bytes, tuple[bytes, ...]]]


def plan_virtual_peers(schema: Schema, credentials: Iterable[Credential],
                       fine: Iterable[Credential] = ()) -> Plan:
    """Each virtual peer's credential with the fine credentials (of ``fine``) it covers,
    itself excepted: the tokens it hands its parents under multi-credential routing."""
    fine = tuple(fine)
    return [(c, tuple(f for f in fine if c.covers(f) and f != c))
            for c in virtual_peer_credentials(schema, credentials)]


def real_kit(schema: Schema, epoch: int, predicate: EventFilter, key: SubscriberKey,
             request_of: RequestOf) -> SubscriberKit:
    """The kit of a subscriber key of the scheme (prepared for decryption): per virtual peer
    its connection request, its routing token (blinded, and as the opener of others'
    requests) and its fine tokens."""
    credential_keys = {k.credential: k for k in key.credentials}
    fine_tokens = {t.credential: t for t in key.fine_tokens}
    virtuals = []
    for cred, fines in plan_virtual_peers(schema, credential_keys, fine_tokens):
        request, sws = request_of(cred)
        token = credential_keys[cred].token
        virtuals.append(VirtualKeys(
            credential=cred, request=request, sws=sws,
            token=codec.encode_blinded_token(token.blinded()),
            fine_tokens=tuple(codec.encode_blinded_token(fine_tokens[f].blinded())
                              for f in fines),
            fine=fines, opener=token))
    return SubscriberKit(epoch, predicate, key, tuple(virtuals))
