"""``bench e2e``'s baseline: the same events through ``nats-server``, AES-GCM encrypted under
one key that the publisher and every subscriber share. The broker sees only ciphertext but
routes by subject, not content, and anyone holding the key reads every event: the price of
that much less protection is what the comparison shows.

``python -m ibe_pubsub.evaluation.e2e_nats pub --url URL --sent-dir DIR`` publishes the
phases of :mod:`evaluation.e2e_pacing`; ``... sub --url URL --events-out FILE`` writes each
delivered event as ``peer run --events-out`` does (the same writer). The key is hex in
``E2E_AES_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import nats
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nats.aio.msg import Msg

from ibe_pubsub.credentials import Event, default_schema
from ibe_pubsub.evaluation.e2e_pacing import serve_phases
from ibe_pubsub.peer import EventWriter, event_line, parse_event

SUBJECT = "e2e.quotes"
NONCE = 12


def seal(aead: AESGCM, event: Event) -> bytes:
    nonce = os.urandom(NONCE)
    return nonce + aead.encrypt(nonce, json.dumps(event_line(event)).encode(), None)


def open_sealed(aead: AESGCM, data: bytes) -> Event:
    plain = aead.decrypt(data[:NONCE], data[NONCE:], None)
    return parse_event(default_schema(), json.loads(plain), "a NATS message")


async def publish(url: str, sent_dir: Path, aead: AESGCM) -> None:
    nc = await nats.connect(url)
    try:
        async def send(event: Event) -> None:
            await nc.publish(SUBJECT, seal(aead, event))

        await serve_phases(send, sent_dir, nc.flush)
    finally:
        await nc.close()


async def subscribe(url: str, events_out: str, aead: AESGCM) -> None:
    writer = EventWriter(events_out)
    nc = await nats.connect(url)

    async def take(msg: Msg) -> None:
        writer.write(open_sealed(aead, msg.data), time.time())

    await nc.subscribe(SUBJECT, cb=take)
    await nc.flush()
    print(json.dumps({"ready": True}), flush=True)
    try:
        await asyncio.to_thread(input)  # until the parent closes stdin
    except EOFError:
        pass
    finally:
        await nc.close()
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("pub", "sub"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--sent-dir")
    parser.add_argument("--events-out")
    args = parser.parse_args()
    aead = AESGCM(bytes.fromhex(os.environ["E2E_AES_KEY"]))
    if args.role == "pub":
        asyncio.run(publish(args.url, Path(args.sent_dir), aead))
    else:
        asyncio.run(subscribe(args.url, args.events_out, aead))


if __name__ == "__main__":
    main()
