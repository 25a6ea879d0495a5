"""``ibe-pubsub publish``: publish events from a JSON-lines file."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
)
from ibe_pubsub.credentials import notice

if TYPE_CHECKING:
    from ibe_pubsub.peer import PublishedIds


def register(subparsers: Any) -> None:
    pub = subparsers.add_parser(
        "publish", help="publish events from a JSON-lines file",
        description="Enrol as publisher for --advertise (or take the keys of --bundle), "
                    "check every event of --events "
                    "against it (nothing is sent if one lies outside), encrypt, sign and send "
                    "each to the root of every attribute tree. Exits non-zero on any refusal.")
    add_key_server(pub)
    add_insecure_transport(pub)
    pub.add_argument("--advertise", metavar="PREDICATE",
                     help="what this publisher will publish (\"\" for everything); required "
                     "unless --bundle")
    pub.add_argument("--bundle", metavar="FILE",
                     help="a publisher's bundle from `bulk issue`: its keys instead of "
                     "enrolling, and its token unless --token is given; advertises what its "
                     "credentials enclose (an --advertise inside them narrows that)")
    add_log_format(pub)
    pub.add_argument("--events", required=True, metavar="FILE",
                     help='JSON lines {"id": ..., "values": {...}, "body": ...} ("-": stdin)')
    pub.add_argument("--interval", type=non_negative_float, default=0.0,
                     help="seconds between events")
    pub.add_argument("--sent-out", metavar="FILE",
                     help='append {"id", "sent_at"} per sent event (for delay measurements)')
    pub.add_argument("--root-timeout", type=non_negative_float, default=30.0,
                     help="seconds to wait for the roots to register")
    pub.add_argument("--flush-timeout", type=non_negative_float, default=30.0,
                     help="seconds to wait for the roots to take every event")
    pub.add_argument("--published-ids", metavar="FILE",
                     help="where the ids this publisher sent are recorded, to warn when a "
                     "later run re-uses one (subscribers drop an id they delivered before; "
                     "default: ibe-pubsub/published_ids.json in $XDG_STATE_HOME or "
                     "~/.local/state)")
    pub.add_argument("--stream-window", type=positive_duration, metavar="DURATION",
                     help="publish as a stream (off by default): the ciphertext header is "
                     "reused while every value stays in its credential cell, for up to "
                     "DURATION (e.g. 1s, 250ms). Much cheaper for fast feeds whose values "
                     "stay in their cells, but events that share a header are linkable by "
                     "their cells within the window, and the events of one run by its "
                     "session key (docs/scheme.md, Streams)")
    pub.add_argument("--stream-max-events", type=positive_int, metavar="N",
                     help="with --stream-window: reuse a header for at most N events")
    pub.set_defaults(handler=cmd_publish)


async def _publish(args: argparse.Namespace) -> int:
    from ibe_pubsub.credentials import PredicateError, StreamWindow
    from ibe_pubsub.keyserver import BundleError, KeyServerRequestError
    from ibe_pubsub.peer import EventFileError, EventPublisher, PublishRefused, read_events

    if args.stream_max_events is not None and args.stream_window is None:
        raise CommandError("--stream-max-events needs --stream-window")
    try:
        window = (StreamWindow(args.stream_window, args.stream_max_events)
                  if args.stream_window is not None else None)
    except ValueError as exc:  # a window from the configuration file, not through the flag
        raise CommandError(f"--stream-window/--stream-max-events: {exc}") from exc
    publisher = EventPublisher(args.server, args.token, args.advertise,
                               server_key=server_key(args),
                               known_servers=known_servers(args), ca_file=args.ca_file,
                               insecure_transport=args.insecure_transport, bundle=args.bundle,
                               stream_window=window)
    try:
        await publisher.enrol()
        assert publisher.params is not None
        events = read_events(args.events, publisher.params.pp.schema, publisher.advertisement)
        _warn_repeated_ids(args, [e.event_id for e in events])
        await publisher.find_roots(args.root_timeout)
    except (PredicateError, EventFileError, KeyServerRequestError, BundleError,
            PublishRefused) as exc:
        await publisher.close(0)
        raise CommandError(str(exc)) from exc
    sent_log = open(args.sent_out, "a", encoding="utf-8") if args.sent_out else None  # noqa: SIM115
    try:
        for i, event in enumerate(events):
            if i and args.interval:
                await asyncio.sleep(args.interval)
            publisher.publish(event)
            if sent_log is not None:
                sent_log.write(json.dumps({"id": event.event_id, "sent_at": time.time()}) + "\n")
                sent_log.flush()
            await asyncio.sleep(0)  # let the transport write as we go
    except PublishRefused as exc:
        raise CommandError(f"{exc} ({publisher.sent} sent before)") from exc
    finally:
        if sent_log is not None:
            sent_log.close()
        _record_ids(args, [e.event_id for e in events[:publisher.sent]])
        delivered = await publisher.close(args.flush_timeout)
    mode = " as a stream" if publisher.stream is not None else ""
    notice(f"sent {publisher.sent} event(s){mode} to the roots of "
           f"{', '.join(sorted(publisher.roots))}")
    if not delivered:
        raise CommandError("some events could not be handed to a root")
    return 0


def _published_ids(args: argparse.Namespace) -> tuple[PublishedIds, str]:
    """The record of ids sent before, and the name of this publisher in it."""
    from ibe_pubsub.peer import PublishedIds, default_published_ids_path, token_publisher

    path = Path(args.published_ids) if args.published_ids else default_published_ids_path()
    return PublishedIds(path), token_publisher(args.token)


def _warn_repeated_ids(args: argparse.Namespace, ids: list[str]) -> None:
    """One line if this publisher sent some of ``ids`` to this key server before."""
    from ibe_pubsub.peer import PublishedIdsError

    record, publisher = _published_ids(args)
    try:
        repeated = record.repeated(args.server, publisher, ids)
    except PublishedIdsError as exc:
        print(f"ibe-pubsub: warning: {exc}; re-used event ids go unnoticed", file=sys.stderr)
        return
    if repeated:
        shown = ", ".join(map(repr, repeated[:5])) + (", ..." if len(repeated) > 5 else "")
        print(f"ibe-pubsub: warning: {len(repeated)} of {len(ids)} event id(s) were published "
              f"before by this publisher to {args.server}: {shown}; subscribers that delivered "
              "them drop these events as duplicates (new ids deliver them again)",
              file=sys.stderr)


def _record_ids(args: argparse.Namespace, ids: list[str]) -> None:
    from ibe_pubsub.peer import PublishedIdsError

    record, publisher = _published_ids(args)
    try:
        record.record(args.server, publisher, ids)
    except PublishedIdsError as exc:
        print(f"ibe-pubsub: warning: {exc}; the ids just sent are not recorded",
              file=sys.stderr)


def cmd_publish(args: argparse.Namespace) -> int:
    if args.advertise is None and args.bundle is None:
        raise CommandError("--advertise PREDICATE (or --bundle FILE) is required")
    args.token = identity_token(args)
    return asyncio.run(_publish(args))
