"""Print matching events from plain blocking code, one JSON object a line.

    python subscribe_sync.py [COUNT]

Settings as for subscribe_async.py.
"""

import itertools
import json
import sys

from ibe_pubsub.client import ClientError, load_options, sync


def main(count: int | None) -> None:
    options = load_options("subscriber")
    with sync.Subscriber.connect(**options) as subscriber:
        print(f"subscribed at {subscriber.address}", file=sys.stderr, flush=True)
        for event in itertools.islice(subscriber, count):
            line = {"id": event.id, "values": dict(event.values), "body": event.body.decode()}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    except ClientError as exc:
        sys.exit(f"subscribe_sync: {exc}")
    except KeyboardInterrupt:
        pass
