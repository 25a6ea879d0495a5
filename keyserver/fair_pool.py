"""Fair issuance: a scheduler in front of the issuer pool, so that one identity's work
cannot hold up another's for long.

Jobs wait in one FIFO queue per identity. Whenever a worker is free, the next identity in
round-robin order that has a waiting job and fewer than ``per_identity`` jobs running gets
one job into the pool. The pool never holds more jobs than it has workers, so a job that
enters it starts at once, and an identity that starts waiting is served after at most
about one job per worker. A subscriber's connection requests, nearly all the work of a
large enrolment, are split into jobs of ``credentials_per_job`` credentials (publisher
keys likewise), which keeps "one job" short. The admin (bulk issuance) may fill every
worker but is still served in turn.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ibe_pubsub.credentials import Credential
from ibe_pubsub.keyserver.actors import ADMIN
from ibe_pubsub.keyserver.exceptions import ServerSettingsError
from ibe_pubsub.keyserver.issuer import (
    IssuerPool,
    issue_connection_requests,
    issue_publisher,
    issue_publisher_shares,
    issue_request_signatures,
    issue_root_shares,
    issue_root_token,
    issue_subscriber,
    issue_subscriber_key,
    issue_subscriber_share,
)


@dataclass
class _Job:
    call: Callable[..., Any]
    args: tuple[Any, ...]
    outcome: asyncio.Future[Any]


class FairIssuer:
    """Issues keys through ``pool``, one job per free worker, round-robin over identities."""

    def __init__(self, pool: IssuerPool, per_identity: int, credentials_per_job: int) -> None:
        if per_identity < 1 or credentials_per_job < 1:
            raise ServerSettingsError(
                "jobs per identity and credentials per job must be at least 1")
        self.pool = pool
        self.per_identity = per_identity
        self.credentials_per_job = credentials_per_job
        self._waiting: dict[str, deque[_Job]] = {}  # insertion order is the round-robin order
        self._running: Counter[str] = Counter()
        self._busy = 0

    async def subscriber(self, who: str, epoch: int, credentials: Sequence[Credential],
                         fine: Sequence[Credential], expires_at: int) -> dict[str, Any]:
        creds = tuple(credentials)
        if len(creds) <= self.credentials_per_job:  # small: one job, one wait
            return await self._run(who, issue_subscriber, epoch, creds, tuple(fine), expires_at)
        key, *requests = await asyncio.gather(
            self._run(who, issue_subscriber_key, epoch, creds, tuple(fine)),
            *(self._run(who, issue_connection_requests, epoch, part, expires_at)
              for part in self._parts(creds)))
        return {"subscriber_key": key,
                "connection_requests": [r for part in requests for r in part]}

    async def publisher(self, who: str, epoch: int, credentials: Sequence[Credential]
                        ) -> dict[str, Any]:
        parts = await asyncio.gather(*(self._run(who, issue_publisher, epoch, part)
                                       for part in self._parts(tuple(credentials))))
        return {"publisher_keys": [k for part in parts for k in part["publisher_keys"]]}

    async def subscriber_share(self, who: str, epoch: int, credentials: Sequence[Credential],
                               fine: Sequence[Credential]) -> str:
        """A threshold member's share of a subscriber's keys: one job (a share costs about
        what version 2's keys without connection requests do)."""
        return await self._run(who, issue_subscriber_share, who, epoch, tuple(credentials),
                               tuple(fine))

    async def request_signatures(self, who: str, epoch: int,
                                 credentials: Sequence[Credential], expires_at: int,
                                 seed: bytes, binding: bytes) -> list[dict[str, str]]:
        """A threshold member's partial signatures of the connection requests derived from
        ``seed``, in chunks like version 2's requests."""
        parts = await asyncio.gather(*(self._run(who, issue_request_signatures, who, epoch,
                                                 part, expires_at, seed, binding)
                                       for part in self._parts(tuple(credentials))))
        return [signature for part in parts for signature in part]

    async def publisher_shares(self, who: str, epoch: int, credentials: Sequence[Credential]
                               ) -> list[str]:
        parts = await asyncio.gather(*(self._run(who, issue_publisher_shares, who, epoch, part)
                                       for part in self._parts(tuple(credentials))))
        return [share for part in parts for share in part]

    async def root_token(self, who: str, epoch: int, credential: Credential) -> str:
        return await self._run(who, issue_root_token, epoch, credential)

    async def root_shares(self, who: str, epoch: int, credential: Credential,
                          transport_key: bytes, expires_at: int) -> dict[str, str]:
        """A threshold member's partial signature of a root certificate and its share of
        the root's token: one job."""
        return await self._run(who, issue_root_shares, who, epoch, credential, transport_key,
                               expires_at)

    def _parts(self, credentials: tuple[Credential, ...]) -> list[tuple[Credential, ...]]:
        n = self.credentials_per_job
        return [credentials[i:i + n] for i in range(0, len(credentials), n)]

    async def _run(self, who: str, call: Callable[..., Any], *args: Any) -> Any:
        job = _Job(call, args, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(who, deque()).append(job)
        self._dispatch()
        return await job.outcome  # cancelling the request cancels the job if still waiting

    def _cap(self, who: str) -> int:
        return self.pool.workers if who == ADMIN else self.per_identity

    def _dispatch(self) -> None:
        while self._busy < self.pool.workers:
            who = next((w for w in self._waiting if self._running[w] < self._cap(w)), None)
            if who is None:
                return
            queue = self._waiting.pop(who)
            job = queue.popleft()
            if queue:
                self._waiting[who] = queue  # to the back of the round
            if not job.outcome.done():  # else cancelled while waiting
                self._start(who, job)

    def _start(self, who: str, job: _Job) -> None:
        try:
            running = self.pool.submit(job.call, *job.args)
        except Exception as exc:  # a broken or closed pool: this job fails, not the scheduler
            job.outcome.set_exception(exc)
            return
        self._busy += 1
        self._running[who] += 1
        running.add_done_callback(partial(self._finished, who, job))

    def _finished(self, who: str, job: _Job, running: asyncio.Future[Any]) -> None:
        self._busy -= 1
        self._running[who] -= 1
        if not self._running[who]:
            del self._running[who]
        if running.cancelled():
            job.outcome.cancel()
        elif (error := running.exception()) is not None:
            if not job.outcome.done():
                job.outcome.set_exception(error)
        elif not job.outcome.done():  # else its request was cancelled while it ran
            job.outcome.set_result(running.result())
        self._dispatch()
