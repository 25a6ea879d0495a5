"""A discrete-event simulator that runs many :class:`PeerMachine` objects.

Time advances through a heap of ``(time, seq, what)``. Every message travels
with the one-way delay of its link (:class:`LatencyModel`) and is processed
when its receiver is free: each peer is a single server whose processing time
per message is what its crypto suite charged (modelled costs, or the measured
time of real cryptography). The machines are exactly those the running peer
uses; the simulator only moves their actions around and records:

- connection delays: join started -> first parent link established;
- dissemination delays: publish -> delivery, per (event, subscriber);
- messages per event (``Publish`` sends), false positives, duplicates.

``droppers`` makes a random fraction of subscribers selective forwarders: they join,
answer heartbeats and receive events like anyone, but every ``Publish`` they send is
dropped (the attack a tree overlay is cheapest to hurt with). Which subscribers drop
depends only on the seed, and the droppers of a smaller fraction are among those of a
larger one, so runs with growing fractions differ only in the added droppers.
``dropper_kind`` makes them worse: ``"lying"`` droppers also name no ancestor in their
heartbeat answers (where the pull repair finds backups); ``"refusing"`` ones lie too and
send no repair traffic (``Watch``, ``Digest``, ``Pull``) and pass on no search for a
further parent (a ``Join`` of an attached peer).

Crypto modes: ``"modeled"`` (default costs or a ``bench crypto`` JSON),
``"plaintext"`` (no security costs), ``"real"`` (the scheme (docs/scheme.md), small populations).
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ibe_pubsub.credentials import Event, Predicate, Schema, StreamWindow
from ibe_pubsub.overlay.actions import Action, Connected, Deliver, Log, Send, publication
from ibe_pubsub.overlay.config import OverlayConfig, OverlayConfigError
from ibe_pubsub.overlay.crypto_model import CostTable
from ibe_pubsub.overlay.issuer import ModeledIssuer, RealIssuer
from ibe_pubsub.overlay.machine import PeerMachine
from ibe_pubsub.overlay.wire import Digest, Join, Message, Ping, Pong, Publish, Pull, Watch

Mode = Literal["modeled", "plaintext", "real"]
DropperKind = Literal["plain", "lying", "refusing"]
EXPIRY = 2**40
#: Shortest time between two ticks of one peer (the asyncio peer ticks every 0.2 s).
TICK_GAP = 0.2


@dataclass(frozen=True)
class LatencyModel:
    """One-way link delay: each ordered pair of peers gets a fixed base delay drawn once,
    log-normal with the given median (seconds) and shape ``sigma``, at most ``cap``, plus a
    uniform jitter of up to ``jitter`` times the base per message. A wide ``sigma`` without
    a cap draws a few links slower than the failure timeout: their heartbeats cannot keep a
    link up, so they model failing links, not slow ones."""

    median: float = 0.04
    sigma: float = 0.5
    jitter: float = 0.1
    cap: float = float("inf")


@dataclass
class Metrics:
    connection_delays: list[float] = field(default_factory=list)
    #: event id -> publish time
    published: dict[str, float] = field(default_factory=dict)
    #: event id -> {subscriber address: delivery time}
    deliveries: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    #: event id -> Publish messages sent for it
    event_messages: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    lost_messages: int = 0
    #: ``Publish`` messages a dropper did not send.
    dropped_events: int = 0
    #: Bytes sent per message type (the wire encoding's length).
    message_bytes: Counter[str] = field(default_factory=Counter)
    logs: Counter[str] = field(default_factory=Counter)

    def dissemination_delays(self) -> list[float]:
        return [t - self.published[e] for e, subs in self.deliveries.items()
                for t in subs.values()]


def summary(values: Iterable[float]) -> dict[str, float]:
    """Mean, median, 95th percentile and count of a sample (empty -> count 0)."""
    xs = sorted(values)
    if not xs:
        return {"count": 0}
    return {"count": len(xs), "mean": statistics.fmean(xs), "median": statistics.median(xs),
            "p95": xs[min(len(xs) - 1, int(0.95 * len(xs)))], "max": xs[-1]}


class Simulator:
    """Peers, their links, the clock; add peers and events, then :meth:`run_until`."""

    def __init__(self, schema: Schema, config: OverlayConfig | None = None, *,
                 mode: Mode = "modeled", costs: CostTable | None = None,
                 latency: LatencyModel | None = None, seed: int = 0, wire: bool = False,
                 epoch: int = 1, tick_gap: float = TICK_GAP,
                 stream_window: StreamWindow | None = None, droppers: float = 0.0,
                 dropper_kind: DropperKind = "plain") -> None:
        if not 0.0 <= droppers < 1.0:
            raise OverlayConfigError(f"droppers must be a fraction in [0, 1), not {droppers!r}")
        if dropper_kind not in ("plain", "lying", "refusing"):
            raise OverlayConfigError(f"unknown dropper kind {dropper_kind!r}")
        self.dropper_kind = dropper_kind
        self.schema = schema
        self.config = config or OverlayConfig()
        self.rng = random.Random(seed)
        self.latency = latency or LatencyModel()
        self.wire = wire
        self.epoch = epoch
        self.tick_gap = tick_gap
        if mode == "real":
            self.issuer: ModeledIssuer | RealIssuer = RealIssuer(schema, stream_window)
        elif stream_window is not None:
            raise OverlayConfigError("streams run on real cryptography only (mode='real')")
        else:
            table = CostTable.zero() if mode == "plaintext" else costs
            self.issuer = ModeledIssuer(schema, table, random.Random(self.rng.random()))
        self.crypto = self.issuer.crypto
        self.machines: dict[str, PeerMachine] = {}
        self.dead: set[str] = set()
        #: Peers that are leaving gracefully and still serve the children they handed over.
        self.leaving: set[str] = set()
        self.roots: dict[str, str] = {}
        self.members: dict[str, list[str]] = defaultdict(list)
        self._listed: dict[str, set[str]] = defaultdict(set)
        self.predicates: dict[str, Predicate] = {}
        self.metrics = Metrics()
        self.now = 0.0
        self._queue: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._busy: dict[str, float] = {}
        #: address -> (time of its scheduled tick, time of its last tick)
        self._ticks: dict[str, tuple[float, float]] = {}
        self._links: dict[tuple[str, str], float] = {}
        self._event_ids: dict[bytes, str] = {}
        self._counter = 0
        self.dropper_fraction = droppers
        #: Subscribers that forward no event (see the module docstring).
        self.droppers: set[str] = set()
        self._dropper_rng = random.Random(f"droppers-{seed}")

    # -- population ------------------------------------------------------------------------

    def _push(self, at: float, what: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, what, payload))

    def _add_machine(self, address: str, machine: PeerMachine) -> None:
        self.machines[address] = machine
        self._ticks[address] = (float("inf"), float("-inf"))
        self._schedule_tick(address)

    def _schedule_tick(self, address: str) -> None:
        """Tick a peer when its machine next has timer work, at most every ``tick_gap``:
        a peer with nothing due costs no simulation steps."""
        scheduled, last = self._ticks[address]
        at = max(self.machines[address].next_tick_at, last + self.tick_gap, self.now)
        if at < scheduled:
            self._ticks[address] = (at, last)
            self._push(at, "tick", address)

    def add_roots(self) -> dict[str, str]:
        """One root peer per attribute tree."""
        for a in self.schema.names:
            self.roots[a] = f"root-{a}"
            self._start_root(a)
            self.members[a].append(self.roots[a])
        return self.roots

    def _start_root(self, attribute: str) -> None:
        address = self.roots[attribute]
        kit = self.issuer.root_kit(attribute, self.epoch, EXPIRY)
        self._add_machine(address, PeerMachine(address, self.crypto.for_peer(), self.config,
                                               random.Random(self.rng.random()), roots=[kit]))

    def restart_root(self, attribute: str) -> None:
        """The root of ``attribute`` crashes and starts again at once at its address: a new
        process, which knows none of the old one's links or virtual peers."""
        self._start_root(attribute)

    def add_subscriber(self, predicate: Predicate, at: float | None = None,
                       max_credentials: int | None = 4, fine_depth: int = 1) -> str:
        """A subscriber that starts joining at ``at`` (default: now) through random members
        of each tree it joins (that tree's root while it has no other member)."""
        self._counter += 1
        address = f"sub-{self._counter}"
        kit = self.issuer.subscriber_kit(predicate, self.epoch, EXPIRY, max_credentials,
                                         fine_depth)
        machine = PeerMachine(address, self.crypto.for_peer(), self.config,
                              random.Random(self.rng.random()), kit=kit)
        self._add_machine(address, machine)
        self.predicates[address] = predicate
        if self._dropper_rng.random() < self.dropper_fraction:
            self.droppers.add(address)
        self._push(self.now if at is None else at, "join", address)
        return address

    def add_publisher(self) -> str:
        self._counter += 1
        address = f"pub-{self._counter}"
        self._add_machine(address, PeerMachine(address, self.crypto.for_peer(), self.config,
                                               random.Random(self.rng.random())))
        return address

    def publish(self, publisher: str, values: dict[str, Any], at: float | None = None) -> str:
        """Encrypt (charging the publisher's time) and send to every root at ``at``."""
        self._counter += 1
        event_id = f"ev-{self._counter}"
        self._push(self.now if at is None else at, "publish", (publisher, event_id, values))
        return event_id

    def kill(self, address: str) -> None:
        """Crash a peer: it stops, messages to it are lost, nobody is told."""
        self.dead.add(address)
        self._unlist(address)

    def _unlist(self, address: str) -> None:
        """Out of the directory: no newcomer joins through it any more."""
        for members in self.members.values():
            if address in members:
                members.remove(address)

    def leave(self, address: str) -> None:
        """Graceful leave at the current time: out of the directory at once, gone once its
        machine has stopped (it serves the children it handed over until they linked
        elsewhere, see ``PeerMachine.leave``)."""
        self._unlist(address)
        self.leaving.add(address)
        self._apply(address, self.machines[address].leave(self.now), self.now)
        self._schedule_tick(address)
        self._gone_if_left(address)

    def _gone_if_left(self, address: str) -> None:
        if address in self.leaving and self.machines[address].stopped:
            self.leaving.discard(address)
            self.kill(address)

    def rollover(self, epoch: int) -> None:
        """Issue every live peer its keys for ``epoch`` now; publishing moves to ``epoch``."""
        self.epoch = epoch
        for address, machine in self.machines.items():
            if address in self.dead:
                continue
            roots = [self.issuer.root_kit(vp.attribute, epoch, EXPIRY)
                     for vp in machine.vpeers.values() if vp.is_top]
            predicate = self.predicates.get(address)
            kit = self.issuer.subscriber_kit(predicate, epoch, EXPIRY) if predicate else None
            self._apply(address, machine.rekey(self.now, kit=kit, roots=roots), self.now)
            self._schedule_tick(address)

    # -- the event loop --------------------------------------------------------------------

    def _delay(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        base = self._links.get((a, b))
        if base is None:
            base = self._links[(a, b)] = min(self.latency.cap, self.latency.median
                                             * self.rng.lognormvariate(0.0, self.latency.sigma))
        return base * (1.0 + self.rng.uniform(0.0, self.latency.jitter))

    def _apply(self, address: str, actions: list[Action], at: float) -> None:
        m = self.metrics
        for action in actions:
            if isinstance(action, Send):
                msg = action.message
                if address in self.droppers:
                    if isinstance(msg, Publish):
                        m.dropped_events += 1
                        continue
                    msg = self._dropper_sends(msg)
                    if msg is None:
                        continue
                data = msg.to_bytes()
                m.messages[type(msg).__name__] += 1
                m.message_bytes[type(msg).__name__] += len(data)
                if isinstance(msg, Publish):
                    m.event_messages[self._event_ids.get(msg.event, "?")] += 1
                payload: Message | bytes = data if self.wire else msg
                self._push(at + self._delay(address, action.to), "msg",
                           (action.to, address, payload, isinstance(msg, Ping | Pong)))
            elif isinstance(action, Deliver):
                m.deliveries[action.event.event_id][address] = at
            elif isinstance(action, Connected):
                if action.link == 1:
                    m.connection_delays.append(at - action.started_at)
                    self._connected(address, action.attribute)
            elif isinstance(action, Log):
                m.logs[action.level] += 1

    def _dropper_sends(self, msg: Message) -> Message | None:
        """What a dropper of :attr:`dropper_kind` sends instead of ``msg`` (None: nothing)."""
        if self.dropper_kind == "plain":
            return msg
        search = isinstance(msg, Join) and msg.depth >= 0
        if self.dropper_kind == "refusing" and (isinstance(msg, Watch | Digest | Pull) or search):
            return None
        if isinstance(msg, Pong):
            return Pong(msg.src_vp, msg.dst_vp, msg.ok, msg.depth, "", "")
        return msg

    def _run_on(self, address: str, at: float, call: Any, urgent: bool = False) -> None:
        """Run one machine call when its peer is free; its actions leave when it is done.
        ``urgent`` calls (heartbeats, timers) are the transport loop's own work: they run on
        arrival, beside whatever cryptography the peer is busy with, so a backlog of joins
        or events never makes a live peer miss its heartbeats."""
        start = at if urgent else max(at, self._busy.get(address, 0.0))
        before = self.crypto.meter.total
        actions = call(start)
        done = start + (self.crypto.meter.total - before)
        if not urgent:
            self._busy[address] = done
        self._apply(address, actions, done)
        self._schedule_tick(address)
        self._gone_if_left(address)

    def step(self) -> bool:
        """Process the next scheduled happening; False when nothing is left."""
        if not self._queue:
            return False
        at, _, what, payload = heapq.heappop(self._queue)
        self.now = at
        if what == "msg":
            to, sender, message, urgent = payload
            if to in self.dead or to not in self.machines:
                self.metrics.lost_messages += 1
                return True
            machine = self.machines[to]
            self._run_on(to, at, lambda t: machine.receive(sender, message, t), urgent)
        elif what == "tick":
            if payload not in self.dead and self._ticks[payload][0] == at:
                self._ticks[payload] = (float("inf"), at)
                self._run_on(payload, at, self.machines[payload].tick, urgent=True)
        elif what == "join":
            self._join(payload, at)
        elif what == "publish":
            self._publish(*payload, at)
        return True

    def _join(self, address: str, at: float) -> None:
        machine = self.machines[address]
        trees = sorted({vp.attribute for vp in machine.vpeers.values()})
        contacts = {}
        for a in trees:
            # Random members: a request then climbs from somewhere in the tree to the nearest
            # peer that covers it, instead of every request starting at the root.
            members = self.members[a][1:] or self.members[a][:1]
            contacts[a] = self.rng.sample(members, k=min(3, len(members)))
        self._run_on(address, at, lambda t: machine.join(contacts, t))

    def _connected(self, address: str, attribute: str) -> None:
        """A peer becomes a contact for newcomers once it has a link in the tree (a directory
        would list connected peers; an unattached one drops every join it gets)."""
        members = self.members[attribute]
        if address not in self.dead and address not in self._listed[attribute]:
            self._listed[attribute].add(address)
            members.append(address)

    def _publish(self, publisher: str, event_id: str, values: dict[str, Any], at: float) -> None:
        data = self.issuer.encrypt(Event(event_id, values, b""), self.epoch, publisher, at)
        self._event_ids[data] = event_id
        self.metrics.published[event_id] = at
        self._run_on(publisher, at, lambda t: publication(data, self.roots))

    def run_until(self, t: float) -> None:
        """Process everything scheduled up to time ``t``."""
        while self._queue and self._queue[0][0] <= t:
            self.step()
        self.now = max(self.now, t)

    # -- expectations ----------------------------------------------------------------------

    def alive_subscribers(self) -> list[str]:
        """Subscribers neither crashed nor gone or going (see :meth:`leave`)."""
        return [a for a in self.predicates if a not in self.dead and a not in self.leaving]

    def expected_receivers(self, values: dict[str, Any]) -> set[str]:
        """Live subscribers whose exact predicate matches an event's values."""
        return {a for a in self.alive_subscribers() if self.predicates[a].matches(values)}

