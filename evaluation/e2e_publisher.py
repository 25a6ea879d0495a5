"""``bench e2e``'s publisher process: the application API (:class:`client.Publisher`) driven
on the schedule of :mod:`evaluation.e2e_pacing`, as an application would publish.

Run as ``python -m ibe_pubsub.evaluation.e2e_publisher --server URL --mode streams|v2
--known-servers FILE --sent-dir DIR`` with the identity's token in ``IBE_PUBSUB_TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from ibe_pubsub.client import Publisher
from ibe_pubsub.credentials import Event
from ibe_pubsub.evaluation.e2e_pacing import serve_phases

#: The stream's reuse window in ``streams`` mode (``publish --stream-window 1s``).
STREAM_WINDOW = 1.0
FLUSH_TIMEOUT = 60.0


async def main(args: argparse.Namespace) -> None:
    window = STREAM_WINDOW if args.mode == "streams" else None
    async with await Publisher.connect(args.server, os.environ["IBE_PUBSUB_TOKEN"], "",
                                       known_servers=args.known_servers,
                                       stream_window=window) as publisher:
        async def send(event: Event) -> None:
            await publisher.publish(event.values, event.body, event.event_id)

        async def flushed() -> None:
            await publisher.event_publisher.transport.flush(FLUSH_TIMEOUT)

        await serve_phases(send, Path(args.sent_dir), flushed)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", required=True)
    parser.add_argument("--mode", choices=("streams", "v2"), required=True)
    parser.add_argument("--known-servers", required=True)
    parser.add_argument("--sent-dir", required=True)
    asyncio.run(main(parser.parse_args()))
