"""The repair against peers that drop events: backups, digests and pulls.

Simulator runs on the real machine, plaintext crypto (the modelled suite still opens
requests and checks acceptance proofs), 40 subscribers of which 30 % forward nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

import pytest

from ibe_pubsub.cli.bench import register
from ibe_pubsub.credentials import Credential, enclosing_path
from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.droppers import EVENT_SPACING, first_owed, replaced_within
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.actions import Action, Log, Send
from ibe_pubsub.overlay.checks import late_timers
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.simulator import Simulator
from ibe_pubsub.overlay.virtual import VirtualPeer
from ibe_pubsub.overlay.wire import Accept, Digest, Message, Publish, Pull, Watch

SCHEMA = default_schema()
SUBSCRIBERS, EVENTS, DROPPERS = 40, 20, 0.3


class Recording(Simulator):
    """The simulator, keeping every message sent: ((sender, virtual peer), to, message,
    whether the receiver was a parent of the sending virtual peer then)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[tuple[str, str], str, Message, bool]] = []

    def _apply(self, address: str, actions: list[Action], at: float) -> None:
        vpeers = self.machines[address].vpeers if address in self.machines else {}
        for a in actions:
            if isinstance(a, Send):
                vp = vpeers.get(a.message.src_vp)
                to_parent = vp is not None and (a.to, a.message.dst_vp) in vp.parents
                self.sent.append(((address, a.message.src_vp), a.to, a.message, to_parent))
        super()._apply(address, actions, at)


def run(routing: str, repair: bool) -> tuple[Recording, dict[str, dict]]:
    # The pull repair alone: no second parent, no demotion.
    config = OverlayConfig(routing=routing, repair=repair, demote_after=0, push_backup=False)
    sim = Recording(SCHEMA, config, mode="plaintext",
                    seed=1, droppers=DROPPERS)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(1))
    for i in range(SUBSCRIBERS):
        sim.add_subscriber(workload.predicate(), at=i * 0.05)
    sim.run_until(SUBSCRIBERS * 0.05 + 12)
    publisher, start = sim.add_publisher(), sim.now
    events = {sim.publish(publisher, v, at=start + 0.2 * i): v
              for i, v in enumerate(workload.values() for _ in range(EVENTS))}
    sim.run_until(start + 0.2 * EVENTS + 5)
    return sim, events


def honest_misses(sim: Simulator, events: dict[str, dict]) -> int:
    honest = set(sim.alive_subscribers()) - sim.droppers
    return sum(len(sim.expected_receivers(v) & honest - set(sim.metrics.deliveries.get(e, {})))
               for e, v in events.items())


@pytest.fixture(scope="module")
def repaired() -> tuple[Simulator, dict[str, dict]]:
    return run("mcr", True)


@pytest.mark.parametrize("routing", ["ohf", "mcr"])
def test_the_repair_recovers_what_droppers_withhold(routing, repaired):
    sim, events = repaired if routing == "mcr" else run(routing, True)
    control, _ = run(routing, False)
    assert sim.droppers == control.droppers and len(sim.droppers) >= 8
    assert honest_misses(control, events) > 0  # the attack works without the repair
    assert honest_misses(sim, events) == 0
    assert sum(m.stats.pulled for m in sim.machines.values()) > 0
    assert late_timers(sim) == []  # tick() and deadline() agree on the repair's timers
    # Pulled events are Publish messages: the repair costs few beside the tree's own.
    assert sim.metrics.messages["Publish"] < 1.5 * control.metrics.messages["Publish"]


def watched(sim: Simulator) -> tuple[str, VirtualPeer, tuple[str, str]]:
    """An honest backup (address, virtual peer) and a peer it backs up whose digests
    listed events that it did not pull (it had them from its parents)."""
    return next((a, vp, node) for a, m in sim.machines.items() if a not in sim.droppers
                for vp in m.vpeers.values() for node, link in vp.watchers.items()
                if any(d in link.offered for d in m.dissemination.raw))


def test_a_backup_serves_each_listed_event_once_and_only_to_its_watcher(repaired):
    sim, _ = repaired
    address, vp, watcher = watched(sim)
    machine, link = sim.machines[address], vp.watchers[watcher]
    offered = [d for d in machine.dissemination.raw if d in link.offered]
    stranger = ("stranger:1", "x")

    def served(frm: tuple[str, str], ids: tuple[bytes, ...]) -> list[Send]:
        actions = machine.receive(frm[0], Pull(frm[1], vp.vp, ids), sim.now)
        return [a for a in actions if isinstance(a, Send)]

    assert served(stranger, tuple(offered[:1])) == []                  # not a watcher
    assert served(watcher, (b"\x00" * 16,)) == []                      # never listed
    sent = served(watcher, tuple(offered[:1]))                         # control: served
    assert [(s.to, type(s.message)) for s in sent] == [(watcher[0], Publish)]
    assert served(watcher, tuple(offered[:1])) == []                   # replayed: once only
    flood = tuple(offered) + tuple(bytes([i]) * 16 for i in range(256 - len(offered)))
    assert len(served(watcher, flood)) == len(offered) - 1             # each listed id once
    assert served(watcher, flood) == []


def test_only_pulled_events_come_from_a_backup_and_only_backups_list(repaired):
    sim, events = repaired
    values = [*events.values(), *(Workload(SCHEMA, random.Random(2)).values()
                                  for _ in range(50))]

    def fresh(machine, vp, inside: bool) -> tuple[bytes, bytes, bytes] | None:
        """A new event (values of the run's) in, or out of, vp's credential: ciphertext,
        id, digest entry."""
        token = machine.dissemination.own_token(vp, sim.epoch)
        for v in values:
            data = sim.issuer.encrypt(Event(f"fresh-{inside}", v, b""), sim.epoch)
            event = machine.crypto.decode_event(data)
            if machine.crypto.route(token, event) == inside:
                entry = machine.crypto.digest_entry(event, vp.attribute,
                                                    vp.credential.position)
                return data, hashlib.sha256(data).digest()[:16], entry
        return None

    machine, vp, backup, (data, event_id, entry) = next(
        (m, vp, b, found) for a, m in sim.machines.items() if a not in sim.droppers
        for vp in m.vpeers.values() for b in vp.backups
        if b[0] not in {p[0] for p in vp.parents}
        for found in [fresh(m, vp, True)] if found is not None)
    publish = Publish(backup[1], vp.vp, vp.attribute, data)
    received = machine.stats.received
    # Unsolicited, the backup's event is dropped like a stranger's.
    actions = machine.receive(backup[0], publish, sim.now)
    assert all(isinstance(a, Log) for a in actions) and machine.stats.received == received
    # A digest from anyone but a backup pulls nothing, nor a malformed one from a backup,
    # nor entries that do not pass the virtual peer's own token (another event's, forged).
    # (Each digest comes a digest interval after the last: a backup sends no more.)
    _, other_id, other_entry = fresh(machine, vp, False)
    at = iter(sim.now + k * sim.config.digest_interval for k in range(1, 10))
    for frm, digest in ((("stranger:1", "x"), Digest("x", vp.vp, (event_id,), (entry,))),
                        (backup, Digest(backup[1], vp.vp, (event_id,), ())),
                        (backup, Digest(backup[1], vp.vp, (event_id,), (other_entry,))),
                        (backup, Digest(backup[1], vp.vp, (event_id,), (b"forged",))),
                        (backup, Digest(backup[1], vp.vp, (other_id,), (other_entry,)))):
        assert all(isinstance(a, Log) for a in machine.receive(frm[0], digest, next(at)))
    # Control: listed by the backup with its entry, the event is pulled once, then taken.
    listed = Digest(backup[1], vp.vp, (event_id,), (entry,))
    actions = machine.receive(backup[0], listed, next(at))
    assert [(a.to, a.message) for a in actions] == [(backup[0], Pull(vp.vp, backup[1],
                                                                     (event_id,)))]
    assert machine.receive(backup[0], listed, next(at)) == []
    machine.receive(backup[0], publish, sim.now)
    assert machine.stats.received == received + 1


def test_a_backup_never_gets_a_token_of_the_peer_it_watches(repaired):
    """The repair hands a backup no routing token (whoever holds one can guess the
    credential behind it): a virtual peer's token bytes leave it only in ``Tokens`` to a
    parent (MCR), never in what it sends a peer that is not its parent, backups included.
    Control: the scan finds them in those ``Tokens`` messages."""
    sim, _ = repaired
    to_parents = to_backups = 0
    for (address, src), to, message, to_parent in sim.sent:
        vp = sim.machines[address].vpeers.get(src)
        if vp is None:
            continue
        data = message.to_bytes()
        carries = any(t in data for k in vp.keys.values() for t in (k.token, *k.fine_tokens))
        assert not carries or (to_parent and type(message).__name__ == "Tokens"), message
        to_parents += carries
        to_backups += not to_parent and (to, message.dst_vp) in vp.backups
    assert to_parents > 10 and to_backups > 100


def test_a_backup_must_cover_the_peer_it_watches(repaired):
    sim, _ = repaired
    # A subscriber virtual peer with a child, and a peer of its tree it does not cover.
    address, vp = next((a, v) for a, m in sim.machines.items() for v in m.vpeers.values()
                       if v.children and not v.is_root and not v.relay)
    machine = sim.machines[address]
    child = next(c for c in vp.children if c[0] != address)
    child_request = sim.machines[child[0]].vpeers[child[1]].keys[sim.epoch].request
    outsider, other = next((a, v) for a, m in sim.machines.items() if a != address
                           for v in m.vpeers.values() if v.attribute == vp.attribute
                           and v.keys and not vp.credential.covers(v.credential))
    before = dict(vp.watchers)
    actions = machine.receive(outsider, Watch(other.vp, vp.vp, b"w" * 16,
                                              other.keys[sim.epoch].request), sim.now)
    assert all(isinstance(a, Log) for a in actions) and vp.watchers == before
    # Control: a peer it covers (its child) gets an acceptance proof and is watched.
    actions = machine.receive(child[0], Watch(child[1], vp.vp, b"w" * 16, child_request),
                              sim.now)
    assert [type(a.message) for a in actions if isinstance(a, Send)] == [Accept]
    assert child in vp.watchers


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ibe-pubsub")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "overlay", *argv])
    return int(args.handler(args))


def test_bench_droppers_writes_both_modes_undefended_before_and_defended(tmp_path: Path):
    assert bench("--out", str(tmp_path), "--experiments", "droppers", "--droppers", "0.3",
                 "--dropper-kinds", "lying", "--dropper-subscribers", "20",
                 "--dropper-events", "5", "--dropper-seeds", "1", "--workers", "1") == 0
    assert (tmp_path / "droppers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads((tmp_path / "droppers.json").read_text())["rows"]
    assert [(r["routing"], r["fraction"], r["kind"]) for r in rows] == [
        ("ohf", 0.3, "lying"), ("mcr", 0.3, "lying")]
    for row in rows:
        for defence in ("before", "defended"):
            assert row["undefended"]["droppers"] == row[defence]["droppers"] > 0
            assert row[defence]["expected"] == row["undefended"]["expected"] > 0
            assert set(row[defence]["repair_messages"]) == {"Watch", "Digest", "Pull"}
        on = row["defended"]
        assert 0 <= on["owing_links"] <= on["dropping_links"]
        assert 0 <= on["owed_replaced_share"] <= 1


def test_replacement_counts_only_what_a_link_was_owed_before_it_went():
    """A link to a dropper is timed from the first event its child's credential encloses,
    sent while it lasted; a link owed nothing is left out; 90 % of the owed links must be
    gone for the 90th percentile to exist."""
    schema = default_schema()
    low, high = ({"price": 10.0}, {"price": 900.0})
    leaf = enclosing_path(schema, "price", 10.0)[-1]
    half = Credential("price", leaf.kind, leaf.path[:1])
    assert half.covers(leaf) and not half.covers(enclosing_path(schema, "price", 900.0)[-1])
    links = {n: ("sub", f"vp{n}", "dropper", "x") for n in range(3)}
    owed = first_owed(schema, dict.fromkeys(links.values(), half), [high, high, low, low],
                       {links[1]: 0.3, links[2]: 0.5})
    # link 0 lasted: first owed at event 2; link 1 went at 0.3 s, before it; link 2 at 0.5 s.
    assert owed == {links[0]: 2 * EVENT_SPACING, links[2]: 2 * EVENT_SPACING}
    runs = [{"owing_links": 4, "replaced_after_owed_s": [1.0, 2.0, 3.0],
             "dropping_links": 9, "replaced_s": [5.0]}]
    assert replaced_within(runs, 0.5, owed=True) == 2.0
    assert replaced_within(runs, owed=True) is None  # 3 of 4 gone: no 90th percentile
    assert replaced_within(runs, 0.1) == 5.0


@pytest.mark.parametrize("value", ["1", "-0.1", "x", "nan"])
def test_bench_refuses_a_dropper_fraction_outside_0_1(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench("--droppers", value)
    assert exit_info.value.code == 2
    assert "fractions in [0, 1)" in capsys.readouterr().err
