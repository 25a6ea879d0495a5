"""The sizes and experiment names of `bench overlay`, apart from the evaluation itself so
that every ``ibe-pubsub`` start-up can show them as defaults without importing it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ibe_pubsub.evaluation.exceptions import BenchSettingsError

#: Droppers of the droppers experiment (see ``overlay.simulator``'s ``dropper_kind``).
DROPPER_KINDS = ("plain", "lying", "refusing")

EXPERIMENTS = ("connection", "degree", "dissemination", "routing", "trees", "encryption",
               "loopback", "droppers", "streams")
#: What runs unless --experiments names others: "streams" runs real cryptography on every
#: peer of the dissemination setting, which takes many minutes.
DEFAULT_EXPERIMENTS = EXPERIMENTS[:-1]
#: The schemas `bench exactness` runs over, by name.
EXACTNESS_SCHEMAS = ("stocks", "strings")
#: Most subscriber processes the loopback cross-check starts.
MAX_LOOPBACK_PEERS = 50


@dataclass(frozen=True)
class Sizes:
    """Every size of the run; the defaults finish in minutes on two cores."""

    peers: tuple[int, ...] = (100, 200, 500, 1000, 2000, 5000)
    max_children: int = 4
    degree_peers: int = 300
    degrees: tuple[int, ...] = (2, 3, 4, 6, 8)
    dissemination_peers: tuple[int, ...] = (100, 200)
    publishers: int = 160
    events_per_publisher: int = 10
    routing_peers: tuple[int, ...] = (100,)
    routing_credentials: int = 1
    routing_fine_depth: int = 1
    tree_subscribers: tuple[int, ...] = (500, 1000)
    subscribers: tuple[int, ...] = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
    encryption_events: int = 50
    calibration_peers: int = 20
    calibration_events: int = 10
    loopback_peers: int = 10
    loopback_events: int = 20
    #: Fractions of subscribers that drop events, and the size of that experiment.
    droppers: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3)
    dropper_subscribers: int = 150
    dropper_events: int = 80
    dropper_seeds: int = 5
    dropper_kinds: tuple[str, ...] = DROPPER_KINDS

    def __post_init__(self) -> None:
        if not self.droppers or any(not 0.0 <= f < 1.0 for f in self.droppers):
            raise BenchSettingsError(f"droppers must be fractions in [0, 1), got {self.droppers!r}")
        if not self.dropper_kinds or not set(self.dropper_kinds) <= set(DROPPER_KINDS):
            raise BenchSettingsError(f"dropper kinds must be among {DROPPER_KINDS}, got "
                                     f"{self.dropper_kinds!r}")
        for name, value in asdict(self).items():
            if name in ("droppers", "dropper_kinds"):
                continue
            values = value if isinstance(value, tuple) else (value,)
            floor = 0 if name == "routing_fine_depth" else 1
            if not values or any(v < floor for v in values):
                raise BenchSettingsError(f"{name.replace('_', '-')} must be at least {floor}, "
                                         f"got {value!r}")
        if self.loopback_peers > MAX_LOOPBACK_PEERS:
            raise BenchSettingsError(f"loopback-peers must be at most {MAX_LOOPBACK_PEERS}")
