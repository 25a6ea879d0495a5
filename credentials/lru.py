"""A least-recently-used map of bounded size: the caches of the scheme never grow without
bound, whatever a peer is sent."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``size`` entries; a hit makes an entry the most recent, an insert past the
    bound evicts the least recent."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def remember(self, key: K, value: V) -> V:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.size:
            self._data.popitem(last=False)
        return value
