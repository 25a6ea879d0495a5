"""Publish the quotes given on the command line from plain blocking code.

    python publish_sync.py SYMBOL:PRICE:VOLUME ...

Settings as for publish_async.py (the advertisement: everything unless set). Prints the id
of each event sent.
"""

import sys

from ibe_pubsub.client import ClientError, load_options, sync


def main(quotes: list[str]) -> None:
    options = load_options("publisher")
    options.setdefault("advertisement", "")
    with sync.Publisher.connect(**options) as publisher:
        for quote in quotes:
            symbol, price, volume = quote.split(":")
            values = {"symbol": symbol, "price": float(price), "volume": int(volume)}
            print(publisher.publish(values, body=f"{symbol} at {price}"), flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ClientError as exc:
        sys.exit(f"publish_sync: {exc}")
