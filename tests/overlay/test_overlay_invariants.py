"""Tree invariants after every step of random join / leave / crash / time sequences."""

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.checks import late_timers, tree_violations
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.simulator import Simulator

SCHEMA = default_schema()


class OverlayChurn(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim = Simulator(SCHEMA, OverlayConfig(routing="mcr", max_children=2),
                             mode="plaintext", seed=1)
        self.sim.add_roots()
        self.workload = Workload(SCHEMA, random.Random(1))

    @rule()
    def join(self) -> None:
        self.sim.add_subscriber(self.workload.predicate(), max_credentials=2)

    @precondition(lambda self: len(self.sim.alive_subscribers()) > 1)
    @rule(pick=st.integers(0, 10**6), graceful=st.booleans())
    def depart(self, pick: int, graceful: bool) -> None:
        alive = self.sim.alive_subscribers()
        address = alive[pick % len(alive)]
        (self.sim.leave if graceful else self.sim.kill)(address)

    @rule(steps=st.integers(1, 400))
    def advance(self, steps: int) -> None:
        """Process messages and timers one at a time, checking after each."""
        for _ in range(steps):
            if not self.sim.step():
                break
            assert tree_violations(self.sim) == []
            assert late_timers(self.sim) == []

    @invariant()
    def containment_and_out_degree(self) -> None:
        assert tree_violations(self.sim) == []


OverlayChurn.TestCase.settings = settings(
    max_examples=12, stateful_step_count=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
TestOverlayChurn = OverlayChurn.TestCase


def test_a_peers_counters_go_to_json_with_their_drop_reasons():
    """A peer writes these at exit (--stats-out); a drop must not break the file."""
    import json
    from dataclasses import asdict

    from ibe_pubsub.overlay.stats import Stats

    stats = Stats(delivered=3)
    stats.drop("not_from_parent")
    stats.drop("not_from_parent")
    assert json.loads(json.dumps(stats.counts())) == {
        **{k: 0 for k in asdict(Stats())}, "delivered": 3, "dropped": 2,
        "dropped_by": {"not_from_parent": 2}}
    # Control: what dataclasses.asdict makes of the Counter, which json.dumps refuses.
    assert asdict(stats)["dropped_by"] == {("not_from_parent", 2): 1}
