"""Carrying the threshold set-up's messages between key servers over HTTP.

Each member serves only its own signed messages (``GET /v3/setup/{round}``) and fetches the
others' from their plan addresses until it has what :meth:`SetupMember.missing` lists:
nothing that arrives can change a member's state except a correctly signed message of a
member (:mod:`ibe_pubsub.keyserver.setup_protocol`), so plain HTTP is enough. A network
attacker can delay or stop the set-up, never steer it. Once a member has its result it
keeps serving until every member said ``done``, or for ``linger`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from ibe_pubsub.keyserver.setup_protocol import (
    MAX_MESSAGE_BYTES,
    ROUNDS,
    RefusedMessage,
    SetupError,
    SetupMember,
    SetupResult,
)

log = logging.getLogger("ibe_pubsub.keyserver.setup")
POLL_SECONDS = 0.1
#: For one whole answer, however slowly its bytes come: a sweep never takes longer.
FETCH_TIMEOUT = 5.0
#: After every member said ``done``: time for the last ones to fetch this member's.
DONE_GRACE_SECONDS = 1.0


def setup_app(member: SetupMember) -> FastAPI:
    """The member's published messages, and nothing that writes."""
    app = FastAPI(title="ibe-pubsub threshold set-up", docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/v3/setup")
    def status() -> dict[str, object]:
        return {"deployment": member.plan.deployment, "member": member.index,
                "plan": member.plan.digest().hex(),
                "published": [r for r in ROUNDS if member.published(r) is not None]}

    @app.get("/v3/setup/{round_name}")
    def message(round_name: str) -> Response:
        data = member.published(round_name) if round_name in ROUNDS else None
        if data is None:
            return JSONResponse({"error": "not_published", "detail": (
                f"member {member.index} has not published a {round_name!r} message"
                if round_name in ROUNDS else f"no round {round_name!r}; rounds: "
                + ", ".join(ROUNDS))}, status_code=404)
        return Response(data, media_type="application/octet-stream")

    return app


async def _fetch(client: httpx.AsyncClient, url: str) -> bytes | None:
    """The message at ``url``; None if not published yet. Refuses an answer over the
    bound before reading it whole."""
    async with client.stream("GET", url) as answer:
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        data = bytearray()
        async for chunk in answer.aiter_bytes():
            data += chunk
            if len(data) > MAX_MESSAGE_BYTES:
                raise RefusedMessage(f"{url} answered more than {MAX_MESSAGE_BYTES} bytes")
        return bytes(data)


class _Fetcher:
    """One sweep over what the member misses; remembers why each member was unreachable,
    for the time-out's message, and logs each refused message once."""

    def __init__(self, member: SetupMember, client: httpx.AsyncClient,
                 fetch_timeout: float = FETCH_TIMEOUT) -> None:
        self.member, self.client, self.fetch_timeout = member, client, fetch_timeout
        self.trouble: dict[int, str] = {}
        self._logged: set[tuple[int, str]] = set()

    async def _one(self, sender: int, round_name: str) -> bytes | None:
        url = f"{self.member.plan.members[sender - 1].url}/v3/setup/{round_name}"
        try:  # the whole answer within the bound: a server that drips bytes is cut off
            data = await asyncio.wait_for(_fetch(self.client, url), self.fetch_timeout)
        except (httpx.HTTPError, RefusedMessage, TimeoutError) as exc:
            self.trouble[sender] = f"{url}: {str(exc) or type(exc).__name__}"
            return None
        self.trouble.pop(sender, None)
        return data

    async def sweep(self) -> None:
        wanted = self.member.missing()
        answers = await asyncio.gather(*(self._one(s, r) for s, r in wanted))
        for (sender, round_name), data in zip(wanted, answers, strict=True):
            if data is None:
                continue
            try:
                self.member.receive(data)
            except RefusedMessage as exc:
                self.trouble[sender] = str(exc)
                if (sender, round_name) not in self._logged:
                    self._logged.add((sender, round_name))
                    log.warning("set-up: refused what member %d's address served for %s: %s",
                                sender, round_name, exc)


def _waiting_for(member: SetupMember, trouble: dict[int, str]) -> str:
    missing: dict[int, list[str]] = {}
    for sender, round_name in member.missing():
        missing.setdefault(sender, []).append(round_name)
    return "; ".join(f"member {s} ({member.plan.members[s - 1].url}): no {', '.join(r)}"
                     + (f" [{trouble[s]}]" if s in trouble else "")
                     for s, r in sorted(missing.items()))


async def run_setup(member: SetupMember, host: str, port: int, timeout: float, linger: float,
                    report: Callable[[str], None], fetch_timeout: float = FETCH_TIMEOUT
                    ) -> SetupResult:
    """Serve this member's messages on ``host:port`` and fetch the others' until the
    set-up finishes; :class:`SetupError` if it does not within ``timeout`` seconds."""
    server = uvicorn.Server(uvicorn.Config(setup_app(member), host=host, port=port,
                                           log_level="warning", lifespan="off",
                                           access_log=False, timeout_graceful_shutdown=1))
    serving = asyncio.create_task(server.serve())
    loop = asyncio.get_running_loop()
    try:
        while not server.started:
            if serving.done():
                raise SetupError(f"cannot listen on {host}:{port}")
            await asyncio.sleep(0.02)
        report(f"member {member.index} of {member.plan.n}: serving on {host}:{port}")
        deadline, finished_at, reached = loop.time() + timeout, None, ""
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT) as client:
            fetcher = _Fetcher(member, client, fetch_timeout)
            while True:
                await fetcher.sweep()
                now = loop.time()
                if member.round_reached() != reached:
                    reached = member.round_reached()
                    report(f"round {reached}")
                if member.result is not None:
                    finished_at = finished_at or now
                    if member.finished_with_everyone():
                        await asyncio.sleep(DONE_GRACE_SECONDS)
                        return member.result
                    if now - finished_at > linger:
                        report(f"still waiting after {linger:.0f} s: "
                               f"{_waiting_for(member, fetcher.trouble)}; stopping anyway "
                               "(this member has its result)")
                        return member.result
                elif now > deadline:
                    raise SetupError(f"the set-up did not finish within {timeout:.0f} s, in "
                                     f"round {reached}; waiting for "
                                     f"{_waiting_for(member, fetcher.trouble)}")
                await asyncio.sleep(POLL_SECONDS)
    finally:
        server.should_exit = True
        await serving
