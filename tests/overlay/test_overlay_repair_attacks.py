"""The repair against hostile backups and watchers: each attack of its review, with a
control that shows the test would see it succeed.

Simulator runs on the real machine, plaintext crypto, no droppers: the attacker's
messages are handed to the machine under attack directly.
"""

from __future__ import annotations

import hashlib
import random

import msgpack
import pytest

from ibe_pubsub.cli.app import build_parser
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.actions import Send
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.crypto import CryptoRejected
from ibe_pubsub.overlay.machine import PeerMachine
from ibe_pubsub.overlay.simulator import Simulator
from ibe_pubsub.overlay.virtual import VirtualPeer
from ibe_pubsub.overlay.wire import Accept, Digest, Pong, Publish, Pull, Watch

SCHEMA = default_schema()
Node = tuple[str, str]


def simulate(routing: str, subscribers: int, repair: bool | None) -> Simulator:
    # The pull repair alone: no second parent, no demotion.
    config = OverlayConfig(routing=routing, repair=repair, demote_after=0, push_backup=False)
    sim = Simulator(SCHEMA, config, mode="plaintext",
                    seed=1)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(1))
    for i in range(subscribers):
        sim.add_subscriber(workload.predicate(), at=i * 0.05)
    sim.run_until(subscribers * 0.05 + 22)  # past the windows of swaps' former parents
    return sim


@pytest.fixture(scope="module")
def sim() -> Simulator:
    return simulate("ohf", 30, repair=True)


def sends(actions: list, kind: type) -> list[Send]:
    return [a for a in actions if isinstance(a, Send) and isinstance(a.message, kind)]


def remote_backups(vp: VirtualPeer) -> list[Node]:
    return [b for b in vp.backups if b[0] not in {p[0] for p in vp.parents}]


VALUES = [Workload(SCHEMA, random.Random(2)).values() for _ in range(200)]


def fresh(sim: Simulator, machine: PeerMachine, vp: VirtualPeer, tag: str
          ) -> tuple[bytes, bytes, bytes] | None:
    """A new event inside vp's credential, if one of VALUES is: ciphertext, id, vp's
    digest entry."""
    token = machine.dissemination.own_token(vp, sim.epoch)
    for k, values in enumerate(VALUES):
        data = sim.issuer.encrypt(Event(f"{tag}-{k}", values, b""), sim.epoch)
        event = machine.crypto.decode_event(data)
        if machine.crypto.route(token, event):
            entry = machine.crypto.digest_entry(event, vp.attribute, vp.credential.position)
            return data, hashlib.sha256(data).digest()[:16], entry
    return None


def watcher(sim: Simulator, backups: int) -> tuple[PeerMachine, VirtualPeer]:
    """A virtual peer with this many backups beside its parents, and events inside it."""
    return next((m, v) for m in sim.machines.values() for v in m.vpeers.values()
                if v.keys and len(remote_backups(v)) >= backups and fresh(sim, m, v, "probe"))


@pytest.mark.parametrize(("routing", "flags", "watches"), [
    ("ohf", [], False), ("mcr", [], True), ("ohf", ["--repair"], True),
    ("mcr", ["--no-repair"], False)])
def test_the_repair_is_on_by_default_under_mcr_only(routing, flags, watches):
    """A backup can learn a watcher's exact credential (forged entries, then what it
    pulls): under OHF that is a new leak, so OHF repairs only when asked to."""
    args = build_parser().parse_args(["peer", "run", "--server", "http://k", "--root", "a",
                                      "--routing", routing, *flags])
    ran = simulate(routing, 8, repair=args.repair)
    assert (ran.metrics.messages["Watch"] > 0) is watches
    assert OverlayConfig(routing=routing, repair=args.repair).repairs is watches


def test_no_parent_is_asked_to_be_an_ohf_backup(sim):
    address, vp, parent = next(
        (a, v, p) for a, m in sim.machines.items() for v in m.vpeers.values()
        if v.keys and not v.relay and len(v.backups) + len(v.watch_asks) < 2
        for p in v.parents if p[0] != a)
    machine = sim.machines[address]
    other_parent = (parent[0], "another-virtual-peer")  # a parent's peer, another of its vps
    stranger = next(a for a in sim.machines if a not in {address, parent[0]}
                    | {b[0] for b in vp.backups})
    for ancestor, asked in ((other_parent, False), ((stranger, "x"), True)):  # control last
        actions = machine.receive(parent[0], Pong(parent[1], vp.vp, True, 1, *ancestor),
                                  sim.now)
        assert [s.to for s in sends(actions, Watch)] == ([stranger] if asked else [])
    vp.watch_asks.clear()


def test_one_request_gets_one_watcher_link_and_one_peer_few(sim):
    root_address, root = next((a, v) for a, m in sim.machines.items()
                              for v in m.vpeers.values() if v.is_top)
    machine = sim.machines[root_address]
    requests = [v.keys[sim.epoch].request for a, m in sim.machines.items() if a != root_address
                for v in m.vpeers.values() if v.keys and v.attribute == root.attribute]

    def watch(address: str, src_vp: str, request: bytes) -> bool:
        actions = machine.receive(address, Watch(src_vp, root.vp, bytes(16), request), sim.now)
        return bool(sends(actions, Accept))

    # One request, many claimed virtual peers: one link.
    assert [watch("attacker:1", f"fake{k}", requests[0]) for k in range(3)] == [
        True, False, False]
    # Many requests (replayed from others) from one peer: at most a peer's share.
    limit = sim.config.max_watchers_per_peer
    assert len(requests) > limit + 1
    accepted = [watch("attacker:2", f"fake{k}", r) for k, r in enumerate(requests)]
    assert sum(accepted) == limit
    # Control: another peer still gets a link.
    assert watch("honest:1", "v", requests[-1])
    for node in [n for n in root.watchers if n[0] in {"attacker:1", "attacker:2", "honest:1"}]:
        del root.watchers[node]


def test_a_backups_digests_cannot_flush_another_backups_pulls(sim):
    machine, vp = watcher(sim, 2)
    hostile, honest = remote_backups(vp)[:2]
    now = sim.now
    for flood in (False, True):  # control first
        data, event_id, entry = fresh(sim, machine, vp, f"flush-{flood}")
        now += sim.config.digest_interval
        listed = machine.receive(honest[0], Digest(honest[1], vp.vp, (event_id,), (entry,)),
                                 now)
        assert sends(listed, Pull)
        for _ in range(flood * 3):  # fresh ids, each with an entry that passes
            now += sim.config.digest_interval
            ids = tuple(random.randbytes(16) for _ in range(128))
            machine.receive(hostile[0], Digest(hostile[1], vp.vp, ids, (entry,) * 128), now)
        received = machine.stats.received
        machine.receive(honest[0], Publish(honest[1], vp.vp, vp.attribute, data), now)
        assert machine.stats.received == received + 1


def test_a_backups_digests_are_rate_limited_and_cost_one_test_per_entry(sim):
    machine, vp = watcher(sim, 1)
    backup = remote_backups(vp)[0]
    _, _, entry = fresh(sim, machine, vp, "rate")
    start, tested = sim.now + 10, machine.stats.entries_tested

    def digest(at: float) -> list:
        ids = tuple(random.randbytes(16) for _ in range(128))
        return machine.receive(backup[0], Digest(backup[1], vp.vp, ids, (entry,) * 128), at)

    assert sends(digest(start), Pull)
    assert [a.text for a in digest(start + 0.1)] == [
        f"{vp.vp}: digest from {backup[0]} too soon, dropped"]
    assert sends(digest(start + sim.config.digest_interval / 2), Pull)  # control: in time
    assert machine.stats.entries_tested - tested <= 1  # one entry, however many ids


@pytest.mark.parametrize("fields", [[1, 0, 2**40, bytes(16)], [1, 0, b"x", bytes(16)]])
def test_a_hostile_digest_entry_is_rejected_not_allocated(sim, fields):
    machine, vp = watcher(sim, 0)
    token = machine.dissemination.own_token(vp, sim.epoch)
    _, _, entry = fresh(sim, machine, vp, "fuzz")
    assert machine.crypto.route_entry(token, entry)  # control: a real entry passes
    with pytest.raises(CryptoRejected):
        machine.crypto.route_entry(token, msgpack.packb(fields))
    tok = msgpack.unpackb(machine.crypto.make_token(vp.credential, sim.epoch))
    with pytest.raises(CryptoRejected):
        machine.crypto.decode_token(msgpack.packb([*tok[:3], fields[2], tok[4]]))
