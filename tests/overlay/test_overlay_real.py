"""The protocol with the real cryptography of docs/scheme.md (small populations), and the
machine's resistance to malformed and forged messages of every type."""

import dataclasses
import random

import pytest
from overlay_sims import publish

from ibe_pubsub.credentials import codec, scheme
from ibe_pubsub.credentials.decomposition import root_credential
from ibe_pubsub.credentials.keys import BlindedToken
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.credentials.streams import Stream, StreamWindow
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.actions import Deliver, Log, Send
from ibe_pubsub.overlay.checks import delivery_errors, tree_violations
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoRejected
from ibe_pubsub.overlay.machine import PeerMachine
from ibe_pubsub.overlay.simulator import EXPIRY, Simulator
from ibe_pubsub.overlay.wire import (
    Accept,
    Detach,
    Digest,
    Handover,
    Join,
    JoinMiss,
    JoinSplit,
    Ping,
    Pong,
    Publish,
    Publishes,
    Pull,
    Recruit,
    SwapAccept,
    SwapHandover,
    SwapOffer,
    Tokens,
    Watch,
    decode,
)

SCHEMA = default_schema()


@pytest.fixture(scope="module")
def real_sim() -> tuple[Simulator, Workload]:
    config = OverlayConfig(routing="mcr", max_children=3, verify_before_forward=True)
    sim = Simulator(SCHEMA, config, mode="real", seed=5, wire=True)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(5))
    for i in range(10):
        sim.add_subscriber(workload.predicate(), at=i * 0.1, max_credentials=2)
    sim.run_until(12)
    return sim, workload


def test_real_crypto_overlay_delivers_exactly_once(real_sim):
    sim, workload = real_sim
    assert tree_violations(sim) == []
    events = publish(sim, workload, k=4, spacing=0.2, drain=6.0)
    assert delivery_errors(sim, events) == []
    assert sum(len(sim.metrics.deliveries.get(e, {})) for e in events) > 0
    assert sim.crypto.meter.calls["open_request"] > 0 and sim.crypto.meter.calls["route"] > 0


def test_real_crypto_overlay_delivers_stream_events_exactly_once(real_sim):
    sim, workload = real_sim
    sim.issuer.stream_window = StreamWindow(5.0)
    try:
        publisher = sim.add_publisher()
        events = {}
        for i in range(8):  # each value twice: the second event reuses every entry
            values = workload.values()
            for k in range(2):
                events[sim.publish(publisher, values, at=sim.now + 0.1 * (2 * i + k))] = values
        sim.run_until(sim.now + 6)
    finally:
        sim.issuer.stream_window = None
    assert delivery_errors(sim, events) == []
    assert sum(len(sim.metrics.deliveries.get(e, {})) for e in events) > 0
    # each peer verified the one session certificate for itself, in caches of its own
    certified = [len(sim.machines[a].crypto.streams.epoch(sim.epoch).certificates)
                 for a in sim.predicates]
    assert set(certified) <= {0, 1} and sum(certified) > 1


def fingerprint(machine: PeerMachine) -> object:
    """Everything a message could change, except the drop counter (a log in numbers)."""
    vps = []
    for vp in sorted(machine.vpeers.values(), key=lambda v: v.vp):
        vps.append((vp.vp, sorted(vp.parents), sorted(vp.children),
                    sorted((c, len(link.tokens)) for c, link in vp.children.items()),
                    sorted(vp.joins), sorted(vp.swaps), vp.split_hint, sorted(vp.assignment),
                    sorted(vp.backups), sorted(vp.watchers), sorted(vp.watch_asks),
                    sum(len(b.pulled) for b in vp.backups.values())))
    stats = dataclasses.replace(machine.stats, dropped=0)
    joining, events = machine.joining, machine.dissemination
    sizes = [len(b) for b in (joining._seen_joins, joining._opened, events._seen,
                              events._processed, events._delivered, events._verified,
                              joining._searches)]
    return vps, stats, sizes


def tamper(data: bytes) -> bytes:
    return data[:-5] + bytes(b ^ 0x5A for b in data[-5:])


def test_forged_and_malformed_messages_change_nothing_but_the_log(real_sim):
    sim, _ = real_sim
    now = sim.now
    # An attached subscriber virtual peer with a parent and a child.
    address, vp = next((a, v) for a in sim.alive_subscribers()
                       for v in sim.machines[a].vpeers.values()
                       if v.parents and v.children and not v.relay)
    machine = sim.machines[address]
    parent, child = next(iter(vp.parents)), next(iter(vp.children))
    stranger = ("stranger:1", "x")
    request = vp.keys[sim.epoch].request
    event = sim.issuer.encrypt(Event("forged", {"symbol": "AAA", "price": 1.0, "volume": 5},
                                     b""), sim.epoch)
    other = sim.issuer.subscriber_kit(parse_predicate(SCHEMA, "price < 10"), sim.epoch + 7,
                                      EXPIRY).virtuals[0].request  # epoch not accepted
    elsewhere = next(n for n in SCHEMA.names if n != vp.attribute)
    join = Join(parent[1], vp.vp, vp.attribute, b"j" * 16, "new:1", "n", 5, request, False, -1)
    cases = [
        (stranger, b"\x93\x01\x02"),                                         # not a message
        (parent, dataclasses.replace(join, request=tamper(request))),        # bad signature
        (parent, dataclasses.replace(join, request=b"garbage")),             # undecodable
        (parent, dataclasses.replace(join, request=other)),                  # wrong epoch
        (parent, dataclasses.replace(join, attribute=elsewhere)),            # other tree
        (parent, Accept(parent[1], vp.vp, b"j" * 16, b"proof", b"")),        # no pending join
        (stranger, Detach(stranger[1], vp.vp)),
        (child, JoinMiss(child[1], vp.vp, b"j" * 16, "", "", -1)),       # no search
        (parent, JoinSplit(parent[1], vp.vp, b"j" * 16)),                    # nothing opened
        (stranger, Recruit(stranger[1], vp.vp, b"j" * 16, request)),         # not a child
        (child, Recruit(child[1], vp.vp, b"j" * 16, tamper(request))),       # bad signature
        (child, Recruit(child[1], vp.vp, b"j" * 16, request)),               # not its request
        (parent, SwapOffer(parent[1], vp.vp, b"j" * 16, request, "p:1", "p", 1)),
        (stranger, SwapAccept(stranger[1], vp.vp, b"j" * 16, b"proof")),
        (stranger, SwapHandover(stranger[1], vp.vp, b"j" * 16)),
        (stranger, Tokens(stranger[1], vp.vp, (b"t",))),
        (child, Tokens(child[1], vp.vp, (b"garbage-token",))),               # bad token
        (stranger, Pong(stranger[1], vp.vp, True, 1, "", "")),
        (stranger, Handover(stranger[1], vp.vp, "x:1", "y")),
        (stranger, Publish(stranger[1], vp.vp, vp.attribute, event)),        # not a parent
        (parent, Publish(parent[1], vp.vp, vp.attribute, b"garbage")),
        (stranger, Publishes("", "", (stranger[1],), (vp.vp,), (vp.attribute,), event)),
        (stranger, Watch(stranger[1], vp.vp, b"w" * 16, tamper(request))),  # bad signature
        (stranger, Watch(stranger[1], vp.vp, b"w" * 16, other)),            # wrong epoch
        (stranger, Digest(stranger[1], vp.vp, (b"i" * 16,), (b"e",))),       # not a backup
        (stranger, Pull(stranger[1], vp.vp, (b"i" * 16,))),                  # not a watcher
    ]
    for sender, message in cases:
        before = fingerprint(machine)
        payload = message if isinstance(message, bytes) else message.to_bytes()
        actions = machine.receive(sender[0], payload, now)
        assert actions and all(isinstance(a, Log) for a in actions), (message, actions)
        assert fingerprint(machine) == before, message
    # The copies a peer takes out of a stranger's Publishes (or a parent's, of garbage)
    # are refused one by one, as the Publish each of them is.
    for sender, data in ((stranger, event), (parent, b"garbage")):
        copies = Publishes("", "", (sender[1],) * 3, (vp.vp, vp.vp, ""),
                           (vp.attribute, elsewhere, vp.attribute), data)
        before = fingerprint(machine)
        for copy in decode(copies.to_bytes()).expand():
            actions = machine.receive(sender[0], copy, now)
            assert actions and all(isinstance(a, Log) for a in actions), (copy, actions)
        assert fingerprint(machine) == before
    # A stranger's heartbeat is answered "not your parent" and changes nothing, also to a
    # virtual peer this peer does not have (a child from before a restart rejoins on it):
    # one answer to the sender itself, as small as the heartbeat.
    for dst in (vp.vp, "no-such-vp"):
        before = fingerprint(machine)
        actions = machine.receive(stranger[0], Ping(stranger[1], dst).to_bytes(), now)
        sent = [a for a in actions if isinstance(a, Send)]
        assert [(s.to, s.message.ok) for s in sent] == [(stranger[0], False)], actions
        assert all(isinstance(a, Send | Log) for a in actions)
        assert fingerprint(machine) == before


def test_forged_events_from_a_parent_are_never_delivered():
    """A subscriber decrypts before it verifies (a false positive costs no verification),
    so a forgery that decrypts and matches must still fail on the signature."""
    sim = Simulator(SCHEMA, OverlayConfig(), mode="real", seed=6)
    sim.add_roots()
    address = sim.add_subscriber(parse_predicate(SCHEMA, "price < 500"), max_credentials=1)
    sim.run_until(5)
    machine = sim.machines[address]
    [vp] = [v for v in machine.vpeers.values() if v.attribute == "price"]
    [parent] = vp.parents
    values = {"symbol": "IBM", "price": 120.5, "volume": 1000}
    group = sim.issuer.pp.group

    def parsed(event_id: str):
        return codec.decode_event(group, sim.issuer.encrypt(Event(event_id, values, b"x"),
                                                            sim.epoch))
    genuine, other = parsed("genuine"), parsed("other")
    forgeries = {
        "tampered payload": dataclasses.replace(genuine, sealed=tamper(genuine.sealed)),
        "signatures of another event": dataclasses.replace(genuine,
                                                           signatures=other.signatures)}
    for name, forged in forgeries.items():
        message = Publish(parent[1], vp.vp, vp.attribute, codec.encode_event(forged))
        actions = machine.receive(parent[0], message.to_bytes(), sim.now)
        assert not any(isinstance(a, Deliver) for a in actions), name
    assert machine.stats.false_positives == 1  # the tampered payload does not decrypt
    assert machine.stats.forged == 1  # the other decrypts and matches: the signature fails
    genuine_bytes = codec.encode_event(genuine)
    actions = machine.receive(parent[0], Publish(parent[1], vp.vp, vp.attribute,
                                                 genuine_bytes).to_bytes(), sim.now)
    assert [a.event.event_id for a in actions if isinstance(a, Deliver)] == ["genuine"]
    assert (machine.stats.delivered, machine.stats.forged) == (1, 1)


def test_forged_acceptances_are_refused_by_a_joining_peer(real_sim):
    sim, _ = real_sim
    kit = sim.issuer.subscriber_kit(parse_predicate(SCHEMA, "price < 50"), sim.epoch, EXPIRY,
                                    max_credentials=1)
    machine = PeerMachine("joiner:1", sim.crypto, sim.config, random.Random(1), kit=kit)
    [send] = machine.join({"price": ["root-price"]}, now=sim.now)
    vp = machine.vpeers[send.message.src_vp]
    join_id = send.message.join_id
    root_cert = sim.machines["root-price"].vpeers[next(iter(
        sim.machines["root-price"].vpeers))].roots[sim.epoch].certificate
    for message in (Accept("r", vp.vp, join_id, b"\x00" * 32, b""),      # bad HMAC
                    Accept("r", vp.vp, join_id, b"\x00" * 64, root_cert),  # bad root signature
                    Accept("r", vp.vp, join_id, b"\x00" * 64, b"junk")):   # bad certificate
        before = fingerprint(machine)
        actions = machine.receive("root-price", message.to_bytes(), sim.now)
        assert all(isinstance(a, Log) for a in actions) and actions
        assert fingerprint(machine) == before
        assert not vp.parents


def test_parents_hold_blinded_tokens_only(real_sim):
    """What a child hands its parent (MCR) names an attribute and a position, never the
    credential."""
    sim, _ = real_sim
    held = [t for m in sim.machines.values() for vp in m.vpeers.values()
            for link in vp.children.values() for t in link.tokens.values()]
    assert held and all(isinstance(t, BlindedToken) for t in held)
    assert not any(hasattr(t, "credential") for t in held)


def test_a_digest_entry_passes_the_route_test_exactly_when_the_event_does(real_sim):
    """A backup lists events with (epoch, C1_i, R_ij) instead of holding a token; the
    watcher's test on it decides as the route test on the whole event, and a forged or
    malformed entry passes nothing."""
    sim, _ = real_sim
    crypto = sim.crypto
    keys = sim.issuer.subscriber_kit(parse_predicate(SCHEMA, "price < 250"), sim.epoch,
                                     EXPIRY, max_credentials=1).virtuals[0]
    token = crypto.decode_token(keys.token)
    j = keys.credential.position

    def event(price: float):
        return crypto.decode_event(sim.issuer.encrypt(
            Event(f"e{price}", {"symbol": "IBM", "price": price, "volume": 7}, b""), sim.epoch))
    inside, outside = event(120.5), event(700.0)
    entry = crypto.digest_entry(inside, "price", j)
    assert crypto.route(token, inside) and crypto.route_entry(token, entry)   # control
    assert len(entry) == 138  # docs/wire-format.md 5.12
    assert not crypto.route(token, outside)
    assert not crypto.route_entry(token, crypto.digest_entry(outside, "price", j))
    assert not crypto.route_entry(token, crypto.digest_entry(inside, "price", j + 1))
    assert not crypto.route_entry(token, crypto.digest_entry(inside, "volume", j))
    assert not crypto.route_entry(token, tamper(entry))                       # other tag
    with pytest.raises(CryptoRejected):
        crypto.route_entry(token, b"garbage")
    with pytest.raises(CryptoRejected):
        crypto.route_entry(token, entry + b"\x00")


def test_a_stream_event_with_an_altered_certificate_copy_is_refused(real_sim):
    """The certificate copy is not signed, its hash is: a peer that knows the certificate by
    hash still refuses a copy that does not match it: every byte of a verified event is
    bound to its signature."""
    sim, workload = real_sim
    pp, crypto = sim.issuer.pp, sim.issuer.crypto.for_peer()
    crypto.open_epoch(sim.epoch)
    mine, other = (Stream(pp, [scheme.keygen_publisher(pp, sim.issuer.msk, root_credential(a),
                                                       sim.epoch) for a in SCHEMA.attributes],
                          StreamWindow(60.0), EXPIRY) for _ in range(2))
    values = workload.values()
    genuine = codec.decode_stream_event(pp.group, crypto.encrypt(mine, Event("a", values, b"")))
    foreign = codec.decode_stream_event(pp.group, crypto.encrypt(other, Event("b", values, b"")))
    assert crypto.verify(genuine)  # control; the certificate is now known by its hash
    swapped = dataclasses.replace(genuine, certificate=foreign.certificate)
    assert not crypto.verify(codec.decode_stream_event(pp.group,
                                                       codec.encode_stream_event(swapped)))
