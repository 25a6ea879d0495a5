"""The publishers of ``bench e2e`` (ours and the NATS baseline) share this: phases read from
stdin, each published on a fixed schedule, its send times written for the parent.

A phase is a JSON line ``{"phase": name, "mode": "streams"|"v2", "rate": r, "seconds": s}``;
the answer is a JSON line on stdout once its last event is handed over. Event ``k`` of a
phase is due at ``start + k / rate``: a publisher that falls behind publishes the next event
at once instead of sleeping after its work, so the offered rate is the one asked for and
falling behind shows as delay, not as a slower schedule.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import Event
from ibe_pubsub.evaluation.bench_streams import feed

#: Body of every event, as in ``bench streams``.
BODY = b"x" * 32
SEED = 2026

Send = Callable[[Event], Awaitable[None]]


def values_of(mode: str) -> Iterator[dict[str, Any]]:
    """``streams``: the same values every event, so every value stays in its cell and the
    header is reused (``bench streams``' ``reused``); ``v2``: a ticks feed (a price walk of
    cent steps, random trade sizes), every event fresh anyway."""
    return feed("reused" if mode == "streams" else "ticks", random.Random(SEED))


async def paced(phase: dict[str, Any], send: Send) -> dict[str, float]:
    """Publish the phase's events on schedule; returns event id -> send time (Unix, taken
    just before ``send`` is called)."""
    rate, values = float(phase["rate"]), values_of(phase["mode"])
    count = max(1, round(rate * float(phase["seconds"])))
    sent: dict[str, float] = {}
    start = time.monotonic()
    for k in range(count):
        wait = start + k / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        event = Event(f"{phase['phase']}-{k}", next(values), BODY)
        sent[event.event_id] = time.time()
        await send(event)
    return sent


async def serve_phases(send: Send, sent_dir: Path, after: Callable[[], Awaitable[None]]
                       ) -> None:
    """Answer ``ready``, then run each phase read from stdin until it closes: the send times
    go to ``sent_dir/PHASE.sent.json``, the answer (events, seconds taken) to stdout after
    ``after()`` (a flush) returned."""
    print(json.dumps({"ready": True}), flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        phase = json.loads(line)
        started = time.monotonic()
        sent = await paced(phase, send)
        await after()
        elapsed = time.monotonic() - started
        (sent_dir / f"{phase['phase']}.sent.json").write_text(json.dumps(sent))
        print(json.dumps({"phase": phase["phase"], "events": len(sent), "seconds": elapsed}),
              flush=True)
