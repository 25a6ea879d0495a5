"""Multi-credential routing at a few hundred subscribers: exactly-once delivery, no link
cycles (a cycle under MCR silently cuts off the fine tokens dealt into it)."""


import pytest
from overlay_sims import publish, settled

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.overlay.actions import Send
from ibe_pubsub.overlay.checks import delivery_counts, delivery_errors, link_cycles, tree_violations
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.wire import Publish, SwapHandover, Tokens

SCHEMA = default_schema()


@pytest.mark.parametrize("mode", ["plaintext", "modeled"])
def test_mcr_delivers_every_match_exactly_once_at_200_subscribers(mode):
    sim, workload = settled(SCHEMA, OverlayConfig(routing="mcr"), 200, seed=1, settle=15.0,
                            mode=mode)
    assert tree_violations(sim) == []
    assert link_cycles(sim) == []
    before = delivery_counts(sim)
    events = publish(sim, workload, k=20, drain=10.0)
    assert delivery_errors(sim, events) == []
    pairs = sum(len(sim.metrics.deliveries.get(e, {})) for e in events)
    assert pairs > 100
    assert delivery_counts(sim) - before == pairs  # nobody delivered anything twice


@pytest.fixture(scope="module")
def root_link():
    """A settled MCR overlay and a root virtual peer's child that routes on two tokens."""
    sim, workload = settled(SCHEMA, OverlayConfig(routing="mcr"), 30, seed=2, mode="plaintext")
    for root in (sim.machines[a] for a in sim.roots.values()):
        for vp in root.vpeers.values():
            for child, link in vp.children.items():
                if child[0] != root.address and len(link.tokens) == 2:
                    return sim, root, vp, child, workload
    raise AssertionError("no child routes on two tokens")


def _event_for(sim, root, token, other, workload):
    """An encrypted event that ``token`` routes and ``other`` does not."""
    decode = sim.crypto.decode_token
    while True:
        data = sim.issuer.encrypt(Event("e", workload.values(), b""), sim.epoch)
        event = sim.crypto.decode_event(data)
        if sim.crypto.route(decode(token), event) and not sim.crypto.route(decode(other), event):
            return data


def _forwards(root, vp, child, data, now) -> bool:
    actions = root.receive("pub-x", Publish("", vp.vp, vp.attribute, data), now)
    return any(isinstance(a, Send) and (a.to, a.message.dst_vp) == child for a in actions)


def test_a_token_a_child_moves_to_another_parent_is_still_routed_for_a_while(root_link):
    """Make before break: the parent that takes a token over may have passed an event on
    before it learnt the token, so the one that gives it up goes on routing it for the
    failure timeout. Control: after that, it no longer routes it."""
    sim, root, vp, child, workload = root_link
    moved, kept = sorted(vp.children[child].tokens)
    now = sim.now + 1.0
    root.receive(child[0], Tokens(child[1], vp.vp, (kept,)), now)
    assert _forwards(root, vp, child, _event_for(sim, root, moved, kept, workload), now + 1)
    later = now + sim.config.failure_timeout + 0.5
    assert not _forwards(root, vp, child, _event_for(sim, root, moved, kept, workload), later)
    assert _forwards(root, vp, child, _event_for(sim, root, kept, moved, workload), later)


def test_a_child_that_swapped_away_still_gets_events_for_a_while(root_link):
    """Its new parent may have passed an event on before adopting it."""
    sim, root, vp, child, workload = root_link
    token = min(vp.children[child].tokens)
    other = next(t for link in vp.children.values() for t in (*link.tokens, *link.withdrawn)
                 if t != token)
    now = sim.now + 10.0
    root.receive(child[0], SwapHandover(child[1], vp.vp, b"j" * 16), now)
    assert child not in vp.children
    assert _forwards(root, vp, child, _event_for(sim, root, token, other, workload), now + 1)
    later = now + sim.config.failure_timeout + 0.5
    assert not _forwards(root, vp, child, _event_for(sim, root, token, other, workload), later)
