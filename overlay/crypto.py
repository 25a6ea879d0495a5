"""What the overlay needs from cryptography, behind one small protocol.

The state machine never touches keys directly: it asks a :class:`CryptoSuite`
to decode, check, open and test opaque objects; a publisher asks the same suite to
encrypt. :mod:`overlay.crypto_real`
implements it with the scheme (docs/scheme.md) (credentials.scheme); :mod:`overlay.crypto_model`
decides by plaintext containment and charges each operation its measured cost,
so the simulator can run thousands of peers. Both record the time spent per
operation in a :class:`CostMeter`, which the simulator turns into processing delay.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from ibe_pubsub.credentials import Credential, Event, EventFilter, RequestOpening, Schema
from ibe_pubsub.overlay.exceptions import OverlayError


class CryptoRejected(OverlayError, ValueError):
    """A request, token, event or proof that does not decode or does not check."""


class CostMeter:
    """Seconds spent per operation (measured or modelled), and a running total. ``clock``
    times :meth:`timed`: wall time by default; ``time.thread_time`` charges the CPU time
    an operation used in this thread, not the wait for a core on a loaded machine, which
    a real peer with a core of its own would not pay."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.total = 0.0
        self.by_op: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def charge(self, op: str, seconds: float) -> None:
        self.total += seconds
        self.by_op[op] += seconds
        self.calls[op] += 1

    @contextmanager
    def timed(self, op: str) -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            self.charge(op, self.clock() - start)


@dataclass(frozen=True)
class VirtualKeys:
    """One virtual peer's material for one epoch: its credential, its signed connection
    request with the SWs of every entry, its routing token and its fine tokens (MCR)."""

    credential: Credential
    request: bytes
    sws: tuple[bytes, ...]
    token: bytes
    fine_tokens: tuple[bytes, ...]
    #: The fine credentials of ``fine_tokens``, in their order.
    fine: tuple[Credential, ...]
    #: What opens other peers' requests: the routing token of ``credential``.
    opener: Any

    @property
    def dealt(self) -> tuple[tuple[bytes, Credential], ...]:
        """What MCR deals to parents, with each token's credential: the fine tokens, or
        the routing token where the credential has none finer."""
        if self.fine_tokens:
            return tuple(zip(self.fine_tokens, self.fine, strict=True))
        return ((self.token, self.credential),)


@dataclass(frozen=True)
class SubscriberKit:
    """A subscriber's keys of one epoch: one entry per virtual peer, plus the decryption key."""

    epoch: int
    predicate: EventFilter
    decrypt_key: Any
    virtuals: tuple[VirtualKeys, ...]


@dataclass(frozen=True)
class RootKit:
    """A root peer's material: the key server's certificate over its transport key."""

    #: The whole-domain credential of the attribute this peer roots.
    credential: Credential
    epoch: int
    certificate: bytes
    #: Signs acceptance proofs (real: Ed25519PrivateKey).
    signer: Any
    #: The whole-domain routing token: opens entry 0 of every request, which tells the root
    #: the requester's position (it tests nothing else: every event lies in the domain).
    opener: Any

    @property
    def attribute(self) -> str:
        return self.credential.attribute


class CryptoSuite(Protocol):
    """Operations of the overlay protocol; objects are opaque to the state machine."""

    meter: CostMeter

    #: The schema of the events and credentials (which credential encloses a value).
    schema: Schema

    def decode_request(self, data: bytes) -> Any: ...

    def request_attribute(self, request: Any) -> str: ...

    def request_epoch(self, request: Any) -> int: ...

    def request_nonce(self, request: Any) -> bytes: ...

    def check_request(self, request: Any, now: float, epochs: Collection[int]) -> None: ...

    def open_request(self, opener: Any, request: Any) -> RequestOpening | None:
        """The SW and the requester's position if ``opener``'s credential covers the
        requester's, else None."""

    def acceptance_proof(self, sw: bytes, request: Any, context: bytes) -> bytes: ...

    def check_acceptance(self, sws: Sequence[bytes], request: Any, proof: bytes,
                         context: bytes) -> bool: ...

    def root_proof(self, root: RootKit, request: Any, context: bytes) -> bytes: ...

    def check_root_proof(self, certificate: bytes, attribute: str, request: Any, proof: bytes,
                         context: bytes, now: float) -> bool: ...

    def decode_token(self, data: bytes) -> Any: ...

    def token_epoch(self, token: Any) -> int: ...

    def decode_event(self, data: bytes) -> Any: ...

    def event_epoch(self, event: Any) -> int: ...

    def event_is_stream(self, event: Any) -> bool: ...

    def route(self, token: Any, event: Any) -> bool: ...

    def digest_entry(self, event: Any, attribute: str, position: int) -> bytes:
        """What the route test at ``position`` of ``attribute`` reads of the event, for a
        peer that lacks it (a backup's digest); no token is needed or revealed."""
        ...

    def route_entry(self, token: Any, entry: bytes) -> bool:
        """The route test on a digest entry (raises :class:`CryptoRejected` if malformed)."""
        ...

    def verify(self, event: Any) -> bool: ...

    def encrypt(self, key: Any, event: Event) -> bytes:
        """A publisher's encoded, encrypted and signed ``event`` under its ``key`` (raises
        ``credentials.scheme.NotAuthorized`` if the key does not cover the event's values)."""
        ...

    def decrypt(self, key: Any, event: Any) -> Event | None: ...

    def open_epoch(self, epoch: int, ends_at: float | None = None) -> None:
        """This peer holds keys of ``epoch`` (which ends at ``ends_at``, if known): its
        events may be cached. Nothing an event says opens an epoch."""

    def drop_epoch(self, epoch: int) -> None:
        """Forget what was cached for ``epoch`` (its keys expired) and refuse its events."""

    def for_peer(self) -> CryptoSuite:
        """The suite for one more peer in this process (the simulator runs many): the same
        parameters and meter, and caches of its own where a real peer would have them."""
