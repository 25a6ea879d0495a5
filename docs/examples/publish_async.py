"""Publish four stock quotes, and try a fifth that lies outside the advertisement.

    python publish_async.py

Settings as `ibe-pubsub publish` takes them: IBE_PUBSUB_SERVER, IBE_PUBSUB_TOKEN,
IBE_PUBSUB_ADVERTISE (here 'price < 500' unless set), IBE_PUBSUB_SERVER_KEY, ... or the
[publish] table of ibe-pubsub.toml. Prints the id of each event sent.
"""

import asyncio
import sys

from ibe_pubsub.client import ClientError, Publisher, PublishRefused, load_options

QUOTES = [("MSFT", 30.5, 100), ("IBMX", 50.0, 200), ("AAPL", 150.0, 300), ("IBM", 120.25, 500)]


async def main() -> None:
    options = load_options("publisher")
    options.setdefault("advertisement", "price < 500")
    async with await Publisher.connect(**options) as publisher:
        for symbol, price, volume in QUOTES:
            values = {"symbol": symbol, "price": price, "volume": volume}
            event_id = await publisher.publish(values, body=f"{symbol} at {price}")
            print(event_id, flush=True)
        try:
            await publisher.publish({"symbol": "IBM", "price": 900.0, "volume": 700})
        except PublishRefused as exc:
            print(f"refused: {exc}", file=sys.stderr)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ClientError as exc:
        sys.exit(f"publish_async: {exc}")
