"""The same with a callback: the subscriber calls it for every event, in order.

    python subscribe_callback.py [COUNT]

Settings as for subscribe_async.py.
"""

import asyncio
import json
import sys

from ibe_pubsub.client import ClientError, Delivery, Subscriber, load_options


async def main(count: int | None) -> None:
    received: list[Delivery] = []
    enough = asyncio.Event()

    async def show(event: Delivery) -> None:
        line = {"id": event.id, "values": dict(event.values), "body": event.body.decode()}
        print(json.dumps(line), flush=True)
        received.append(event)
        if len(received) == count:
            enough.set()

    options = load_options("subscriber")
    async with await Subscriber.connect(**options, on_event=show) as subscriber:
        print(f"subscribed at {subscriber.address}", file=sys.stderr, flush=True)
        await enough.wait()


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
    except ClientError as exc:
        sys.exit(f"subscribe_callback: {exc}")
    except KeyboardInterrupt:
        pass
