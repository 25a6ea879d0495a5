"""Events as the application sees them: what a subscriber receives, and the ids a
publisher makes up for the events it is given no id for."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ibe_pubsub.overlay import Deliver

#: Attribute values as the schema types them: int, float or str.
Value = int | float | str


@dataclass(frozen=True)
class Delivery:
    """A delivered event: verified, decrypted, and matching the subscription exactly."""

    id: str
    #: Every attribute of the schema, typed as it says (read-only).
    values: Mapping[str, Value]
    body: bytes
    #: When this peer delivered it (Unix time), for measuring delays.
    received_at: float
    #: The key epoch it was encrypted for.
    epoch: int
    #: Whether it came as a stream event (its header shared with others of its publisher's
    #: stream), not a version-2 event.
    stream: bool

    @classmethod
    def of(cls, delivery: Deliver, received_at: float) -> Delivery:
        event = delivery.event
        return cls(event.event_id, MappingProxyType(dict(event.values)), event.body,
                   received_at, delivery.epoch, delivery.stream)


class EventIds:
    """Ids unique across publishers and runs: a random prefix per publisher and a counter.
    Subscribers deliver an id once, so a re-used id would silently deliver nothing."""

    def __init__(self) -> None:
        self.prefix = uuid.uuid4().hex[:16]
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}-{next(self._counter)}"
