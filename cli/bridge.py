"""``ibe-pubsub bridge mqtt|nats in|out``: connect the overlay to a local MQTT broker or NATS
server (docs/bridges.md). ``in`` publishes a topic's messages into the overlay as events;
``out`` runs a subscriber and publishes its events to the broker."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from ibe_pubsub.cli.arguments import (
    CommandError,
    add_insecure_transport,
    add_key_server,
    add_log_format,
    identity_token,
    known_servers,
    non_negative_float,
    positive_duration,
    positive_int,
    server_key,
    write_json_atomically,
)
from ibe_pubsub.cli.peer import _check_listen, _stop_on_signals, _stopped_by
from ibe_pubsub.credentials import notice

if TYPE_CHECKING:
    from ibe_pubsub.bridges import Broker, InBridge, OutBridge

T = TypeVar("T")

#: Each broker: its default port, and an example topic in and out.
BROKERS = {
    "mqtt": (1883, "sensors/quotes", "quotes/{symbol}"),
    "nats": (4222, "sensors.quotes", "quotes.{symbol}"),
}


def broker_address(text: str) -> tuple[str, int | None]:
    """``--broker``: HOST or HOST:PORT (an IPv6 address in brackets)."""
    host, colon, port = str(text).strip().rpartition(":")
    if not colon or "]" in port:
        host, port = str(text).strip(), ""
    host = host.strip("[]")
    if not host or (port and not port.isdigit()) or (port and not 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(f"expected HOST or HOST:PORT, got {text!r}")
    return host, int(port) if port else None


def register(subparsers: Any) -> None:
    bridge = subparsers.add_parser(
        "bridge", help="bridge MQTT or NATS topics into and out of the overlay",
        description="Connect the overlay to the brokers already running inside a trust "
                    "domain: `in` publishes a local topic's messages into the overlay as "
                    "events, `out` delivers a subscriber's events to a local topic. See "
                    "docs/bridges.md. Needs the 'bridges' extra.")
    kinds = bridge.add_subparsers(dest="bridge_broker", metavar="BROKER")
    for kind, (port, topic_in, topic_out) in BROKERS.items():
        name = "MQTT broker" if kind == "mqtt" else "NATS server"
        what = "topic" if kind == "mqtt" else "subject"
        group = kinds.add_parser(kind, help=f"bridge the {name} of this trust domain",
                                 description=f"Bridge the {name} of this trust domain: "
                                 "`in` or `out`.")
        directions = group.add_subparsers(dest="bridge_direction", metavar="DIRECTION")
        inbound = directions.add_parser(
            "in", help=f"publish a {what}'s messages into the overlay",
            description=f"Enrol as publisher for --advertise, subscribe to --topic on the "
                        f"{name} and publish each message into the overlay. A message is "
                        'one JSON object {"id"?: str, "values": {...}, "body"?: str}, as '
                        "the lines of `publish --events`; one that is not, or lies outside "
                        "the advertisement, is refused with a log line and counted. Runs "
                        "until SIGINT/SIGTERM, then prints a summary line.")
        inbound.add_argument("--advertise", metavar="PREDICATE",
                             help="what this publisher will publish (\"\" for everything); "
                             "required unless --bundle")
        inbound.add_argument("--bundle", metavar="FILE",
                             help="a publisher's bundle from `bulk issue` instead of "
                             "enrolling")
        inbound.add_argument("--topic", required=True, metavar=what.upper(),
                             help=f"the {what} to consume (wildcards allowed), e.g. {topic_in}")
        inbound.add_argument("--root-timeout", type=non_negative_float, default=30.0,
                             help="seconds to wait for the roots to register")
        outbound = directions.add_parser(
            "out", help=f"deliver a subscriber's events to a {what}",
            description=f"Join the overlay as a subscriber for --subscribe and publish each "
                        f"event it delivers to the {name}, on the {what} --topic makes of "
                        "the event ({id} and {ATTRIBUTE} are replaced by its values), as "
                        'the JSON object {"id", "values", "body", "delivered_at"} that '
                        "`peer run --events-out` writes. Runs until SIGINT/SIGTERM, then "
                        "prints a summary line.")
        outbound.add_argument("--subscribe", metavar="PREDICATE",
                              help="subscribe, e.g. 'symbol prefix \"IB\"'; required unless "
                              "--bundle")
        outbound.add_argument("--bundle", metavar="FILE",
                              help="a subscriber's bundle from `bulk issue` instead of "
                              "enrolling")
        outbound.add_argument("--listen", default="127.0.0.1:0",
                              help="HOST:PORT to accept peers on, an address they can dial "
                              "(as `peer run --listen`)")
        outbound.add_argument("--topic", required=True, metavar="TEMPLATE",
                              help=f"the {what} of each event, e.g. {topic_out} (values' "
                              "separator and wildcard characters become _)")
        for command in (inbound, outbound):
            _add_common(command, kind, name, port)
            command.set_defaults(handler=cmd_bridge, broker_kind=kind,
                                 direction="in" if command is inbound else "out")


def _add_common(command: argparse.ArgumentParser, kind: str, name: str, port: int) -> None:
    add_key_server(command)
    add_insecure_transport(command)
    command.add_argument("--broker", type=broker_address, metavar="HOST[:PORT]",
                         help=f"the {name} (default 127.0.0.1:{port})")
    if kind == "mqtt":
        command.add_argument("--client-id", metavar="ID",
                             help="a fixed MQTT client id: the session is then persistent, so "
                             "a broker that stays up keeps QoS 1 messages for the bridge "
                             "while it is away (default: a new id, clean session)")
    command.add_argument("--queue-size", type=positive_int, default=10_000,
                         help="messages held while the other side is slow or down; beyond "
                         "it the oldest is dropped and counted")
    command.add_argument("--max-backoff", type=positive_duration, default="5s",
                         metavar="DURATION",
                         help="longest wait between attempts to reach the broker (they start "
                         "at 100 ms and double), e.g. 5s")
    command.add_argument("--ack-timeout", type=positive_duration, default="5s",
                         metavar="DURATION",
                         help="how long the broker may take to acknowledge; then the "
                         "connection counts as lost")
    command.add_argument("--flush-timeout", type=non_negative_float, default=10.0,
                         help="seconds, when stopping, to hand on what is still queued")
    add_log_format(command)
    command.add_argument("--ready-file", metavar="FILE",
                         help="write {pid, broker, topic} as JSON here once connected (and, "
                         "in, subscribed)")
    command.add_argument("--stats-out", metavar="FILE",
                         help="write the bridge's counters as JSON here when it stops")


def _broker(args: argparse.Namespace) -> Broker:
    """The broker to bridge; one error line if its client library is missing."""
    from ibe_pubsub.bridges import BridgeError

    host, port = args.broker or ("127.0.0.1", None)
    try:
        if args.broker_kind == "mqtt":
            from ibe_pubsub.bridges import MqttBroker

            return MqttBroker(host, port or BROKERS["mqtt"][0], args.client_id,
                              args.ack_timeout)
        from ibe_pubsub.bridges import NatsBroker

        return NatsBroker(host, port or BROKERS["nats"][0], args.ack_timeout)
    except BridgeError as exc:
        raise CommandError(str(exc)) from exc


def cmd_bridge(args: argparse.Namespace) -> int:
    broker = _broker(args)
    wanted = args.advertise if args.direction == "in" else args.subscribe
    if wanted is None and args.bundle is None:
        flag = "--advertise" if args.direction == "in" else "--subscribe"
        raise CommandError(f"{flag} PREDICATE (or --bundle FILE) is required")
    if args.direction == "out":
        _check_listen(args.listen)
    args.token = identity_token(args)
    return asyncio.run(_run(args, broker))


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``await work``, abandoned (None) as soon as ``stop`` is set by a signal."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _run(args: argparse.Namespace, broker: Broker) -> int:
    from ibe_pubsub.bridges import BridgeError, InBridge, OutBridge, TopicTemplate
    from ibe_pubsub.client import ClientError, Publisher, SendFailed, Subscriber

    stop = asyncio.Event()
    received = _stop_on_signals(stop)
    trust = {"server_key": server_key(args), "known_servers": known_servers(args),
             "ca_file": args.ca_file, "insecure_transport": args.insecure_transport,
             "bundle": args.bundle}
    options = {"queue_size": args.queue_size, "max_backoff": args.max_backoff}
    client: Publisher | Subscriber | None = None
    bridge: InBridge | OutBridge
    try:
        if args.direction == "in":
            client = await _unless_stopped(Publisher.connect(
                args.server, args.token, args.advertise, root_timeout=args.root_timeout,
                **trust), stop)
            if client is None:
                return _stopped_by(received)
            bridge = InBridge(broker, args.topic, client, **options)
        else:
            template = TopicTemplate(args.topic, broker.reserved)
            client = await _unless_stopped(Subscriber.connect(
                args.server, args.token, args.subscribe, args.listen, **trust), stop)
            if client is None:
                return _stopped_by(received)
            bridge = OutBridge(broker, template, client, **options)
        bridge.start()  # an out-bridge's topic template is checked against the schema here
    except (ClientError, BridgeError) as exc:
        if client is not None:
            await client.close()  # nothing was sent or taken yet
        raise CommandError(f"bridge could not start: {exc}") from exc
    loop = asyncio.get_running_loop()
    announcer = loop.create_task(_announce(args, bridge))
    watched = [bridge.failed.wait()]  # a task of the bridge failed: it forwards no more
    if isinstance(client, Subscriber):  # a bundle's keys expired: nothing more comes
        watched.append(client.node.failed.wait())
    for failure in watched:
        loop.create_task(failure).add_done_callback(lambda _: stop.set())
    await stop.wait()
    announcer.cancel()
    try:
        if isinstance(client, Subscriber):
            await client.close()  # its last events go to the bridge's queue first
        await bridge.close(args.flush_timeout)
        if isinstance(client, Publisher):
            await client.close(args.flush_timeout)
    except SendFailed as exc:
        notice(f"ibe-pubsub: warning: {exc}")
    notice(bridge.summary())
    if args.stats_out:
        write_json_atomically(args.stats_out, dataclasses.asdict(bridge.counters))
    if bridge.failure is not None:
        raise CommandError(bridge.failure)
    if isinstance(client, Subscriber) and client.node.failure is not None:
        raise CommandError(client.node.failure)
    return _stopped_by(received)


async def _announce(args: argparse.Namespace, bridge: InBridge | OutBridge) -> None:
    await bridge.ready.wait()
    notice(f"bridge {args.direction} ready: {bridge.broker.name}, {bridge.topic}")
    if args.ready_file:
        write_json_atomically(args.ready_file, {"pid": os.getpid(),
                                                "broker": bridge.broker.name,
                                                "topic": bridge.topic})
