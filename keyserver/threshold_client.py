"""Enrolment with a threshold deployment (docs/scheme.md section 16): ask ``t`` members for
their shares at once, check every share against the deployment's public key, and combine
the shares of one set of ``t`` members into ordinary version-2 keys. A member that is down,
refuses, or answers a share that does not verify is replaced by the next one, and the
reason is kept in the result, so an application can alert on a member answering bad
shares.

Members answer only for identities registered and allowed there, so each member has its
own token. Shares are combined only among members that issued for the same epoch and the
same credentials: keys exist only where ``t`` members agree.

    tpk = read_public_document(Path("threshold.json"), group)[1]
    async with ThresholdKeyClient(pp, tpk, [MemberAccess(1, url1, token1), ...]) as client:
        combined = await client.enrol_subscriber("symbol = IBM")
        key = combined.key        # a SubscriberKey like version 2's
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import random
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from ibe_pubsub.credentials import CodecError, PublicParams, PublisherKey, SubscriberKey
from ibe_pubsub.credentials import threshold as T
from ibe_pubsub.keyserver.client import KeyServerRequestError
from ibe_pubsub.keyserver.exceptions import KeyServerError

log = logging.getLogger(__name__)
Share = TypeVar("Share")
Shape = tuple[Any, ...]
"""What the shares to combine must agree on: the epoch first, then the credentials."""


@dataclass(frozen=True)
class MemberAccess:
    """Where member ``index`` of the deployment answers, and this identity's token there."""

    index: int
    url: str
    token: str


@dataclass(frozen=True)
class Failure:
    """A member whose answer was not used, and why."""

    index: int
    reason: str


@dataclass(frozen=True)
class CombinedSubscriberKey:
    key: SubscriberKey
    expires_at: int
    members: tuple[int, ...]
    """The members whose shares were combined."""
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class CombinedPublisherKeys:
    keys: tuple[PublisherKey, ...]
    members: tuple[int, ...]
    failures: tuple[Failure, ...]


class ThresholdEnrolmentError(KeyServerError):
    """Fewer than ``t`` members answered shares that verify and agree; ``failures`` says
    which members and why."""

    failures: tuple[Failure, ...] = ()


def _no_agreement(t: int, failures: Sequence[Failure]) -> ThresholdEnrolmentError:
    reasons = "; ".join(f"member {f.index}: {f.reason}" for f in failures)
    error = ThresholdEnrolmentError(f"no {t} members answered shares that verify and agree "
                                    f"({reasons})")
    error.failures = tuple(failures)
    return error


class _BadAnswer(Exception):
    """A member's answer that cannot be used (its text is the reason)."""


@dataclass
class _Collected(Generic[Share]):
    shares: dict[int, Share]
    failures: list[Failure]


class ThresholdKeyClient:
    """Async client of ``t``-of-``n`` members; ``members`` lists those this identity may
    ask (at least ``t``). ``spread`` starts at a random member so that many clients share
    the load; without it members are asked in the order given."""

    def __init__(self, pp: PublicParams, tpk: T.ThresholdPublicKey,
                 members: Sequence[MemberAccess], timeout: float = 30.0, spread: bool = True,
                 verify: bool | str | ssl.SSLContext = True) -> None:
        indices = [m.index for m in members]
        if len(set(indices)) != len(indices) or any(not 0 < i <= tpk.n for i in indices):
            raise KeyServerError(f"members must be distinct servers of 1..{tpk.n}, got "
                                 f"{indices}")
        if len(members) < tpk.t:
            raise KeyServerError(f"combining needs {tpk.t} members, {len(members)} given")
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self.pp, self.tpk, self.members, self.spread = pp, tpk, tuple(members), spread
        self._http = httpx.AsyncClient(timeout=timeout, verify=verify)

    async def __aenter__(self) -> ThresholdKeyClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def enrol_subscriber(self, subscription: str, fine_depth: int = 1,
                               max_credentials: int | None = None,
                               epoch: str | int | None = None) -> CombinedSubscriberKey:
        """Keys for ``subscription`` combined from ``t`` members' verified shares."""
        body = {"subscription": subscription, "fine_depth": fine_depth,
                "max_credentials": max_credentials, "epoch": epoch}
        found = await self._collect("/v3/enrol/subscriber", body, self._subscriber)
        shares = [share for share, _ in found.shares.values()]
        key = T.combine_subscriber_key(self.pp, self.tpk, shares)
        return CombinedSubscriberKey(key, min(until for _, until in found.shares.values()),
                                     tuple(found.shares), tuple(found.failures))

    async def enrol_publisher(self, advertisement: str, max_credentials: int | None = None,
                              epoch: str | int | None = None) -> CombinedPublisherKeys:
        """One publisher key per credential of ``advertisement``, combined likewise."""
        body = {"advertisement": advertisement, "max_credentials": max_credentials,
                "epoch": epoch}
        found = await self._collect("/v3/enrol/publisher", body, self._publisher)
        per_member = list(found.shares.values())
        keys = tuple(T.combine_publisher_key(self.pp, self.tpk, [shares[k] for shares in
                                                                 per_member])
                     for k in range(len(per_member[0])))
        return CombinedPublisherKeys(keys, tuple(found.shares), tuple(found.failures))

    # -- reading one member's answer: (what must agree, the verified share) ------------------

    def _subscriber(self, index: int, answer: Any) -> tuple[Shape, tuple[T.SubscriberKeyShare,
                                                                            int]]:
        share = T.decode_subscriber_share(self.pp.group, _decoded(answer["share"]))
        key = share.key
        credentials = tuple(k.credential for k in key.credentials)
        fine = tuple(f.credential for f in key.fine_tokens)
        _check_index(index, share.index)
        if not T.verify_subscriber_share(self.pp, self.tpk, share, key.epoch, credentials,
                                         fine):
            raise _BadAnswer("its share does not verify against the deployment's public key")
        return (key.epoch, credentials, fine), (share, int(answer["expires_at"]))

    def _publisher(self, index: int, answer: Any) -> tuple[Shape,
                                                           list[T.PublisherKeyShare]]:
        shares = [T.decode_publisher_share(self.pp.group, _decoded(s))
                  for s in answer["shares"]]
        if not shares:
            raise _BadAnswer("it answered no share")
        epoch = shares[0].key.epoch
        for share in shares:
            _check_index(index, share.index)
            if share.key.epoch != epoch or not T.verify_publisher_share(
                    self.pp, self.tpk, share, share.key.credential, epoch):
                raise _BadAnswer("a share does not verify against the deployment's public key")
        return (epoch, tuple(s.key.credential for s in shares)), shares

    # -- asking members until t agree ---------------------------------------------------------

    async def _ask(self, member: MemberAccess, path: str, body: dict[str, Any]) -> Any:
        try:
            response = await self._http.post(
                member.url.rstrip("/") + path, content=json.dumps(body).encode("ascii"),
                headers={"Authorization": f"Bearer {member.token}",
                         "content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise _BadAnswer(f"unreachable at {member.url}: {exc!r}") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = response.text
        if response.status_code >= 400:
            raise _BadAnswer(str(KeyServerRequestError(response.status_code, answer)))
        return answer

    def _order(self) -> deque[MemberAccess]:
        members = list(self.members)
        if self.spread:
            random.shuffle(members)
        return deque(members)

    async def _collect(self, path: str, body: dict[str, Any],
                       read: Callable[[int, Any], tuple[Shape, Share]]
                       ) -> _Collected[Share]:
        """Ask ``t`` members, then one more for each that fails or disagrees, until ``t``
        verified shares agree on the epoch and credentials. The members asked later are
        asked for the epoch of the largest agreeing group (the newest of equal ones): one
        member cannot steer the others to an epoch they refuse. Answers that straddle an
        epoch boundary can leave too few members for either epoch: the error then names
        ``epoch_unavailable``, and asking again works."""
        t, waiting = self.tpk.t, self._order()
        groups: dict[Shape, dict[int, Share]] = {}
        failures: list[Failure] = []
        running: dict[asyncio.Task[Any], MemberAccess] = {}

        def ask(member: MemberAccess, epoch: str | int | None) -> None:
            task = asyncio.create_task(self._ask(member, path, body | {"epoch": epoch}))
            running[task] = member

        for _ in range(t):
            ask(waiting.popleft(), body["epoch"])
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    member = running.pop(task)
                    try:
                        shape, share = read(member.index, task.result())
                    except _BadAnswer as exc:
                        failures.append(Failure(member.index, str(exc)))
                        continue
                    except (CodecError, T.ThresholdError, KeyError, TypeError, ValueError,
                            binascii.Error) as exc:
                        failures.append(Failure(member.index, f"its answer is not a share: "
                                                f"{exc}"))
                        continue
                    groups.setdefault(shape, {})[member.index] = share
                shape, best = max(groups.items(), key=lambda g: (len(g[1]), g[0][0]),
                                  default=(None, {}))
                if len(best) >= t:
                    self._report(failures)
                    return _Collected(dict(sorted(best.items())[:t]), failures)
                epoch = body["epoch"] if shape is None else shape[0]
                for _ in range(min(t - len(best) - len(running), len(waiting))):
                    ask(waiting.popleft(), epoch)
        finally:
            for task in running:
                task.cancel()
        self._report(failures)
        raise _no_agreement(t, failures)

    def _report(self, failures: Sequence[Failure]) -> None:
        for failure in failures:
            log.warning("threshold member %d: %s", failure.index, failure.reason)


def _decoded(text: Any) -> bytes:
    if not isinstance(text, str):
        raise _BadAnswer("its answer holds no base64 share")
    return base64.b64decode(text, validate=True)


def _check_index(asked: int, answered: int) -> None:
    if answered != asked:
        raise _BadAnswer(f"it answered with member {answered}'s share")
