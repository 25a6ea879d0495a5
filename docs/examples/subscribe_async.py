"""Print the events that match a subscription as they arrive, one JSON object a line.

    python subscribe_async.py [COUNT]

Stops after COUNT events, or on Ctrl-C. Settings as `ibe-pubsub peer run` takes them:
IBE_PUBSUB_SERVER, IBE_PUBSUB_TOKEN, IBE_PUBSUB_SUBSCRIBE, IBE_PUBSUB_SERVER_KEY, ... or
the [peer.run] table of ibe-pubsub.toml.
"""

import asyncio
import json
import sys

from ibe_pubsub.client import ClientError, Subscriber, load_options


async def main(count: int | None) -> None:
    options = load_options("subscriber")
    async with await Subscriber.connect(**options) as subscriber:
        print(f"subscribed at {subscriber.address}", file=sys.stderr, flush=True)
        received = 0
        async for event in subscriber:
            line = {"id": event.id, "values": dict(event.values), "body": event.body.decode()}
            print(json.dumps(line), flush=True)
            received += 1
            if received == count:
                break


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
    except ClientError as exc:
        sys.exit(f"subscribe_async: {exc}")
    except KeyboardInterrupt:
        pass
