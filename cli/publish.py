"""``ibe-pubsub publish``: publish events from a JSON-lines file, or a live feed of them
(stdin or a FIFO, read as lines arrive), through the application API's publisher, which
renews the keys at every epoch rollover and holds back while the roots are slow."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli.arguments import (
    CommandError,
    add_insecure_transport,
    add_key_server,
    add_log_format,
    identity_token,
    known_servers,
    non_negative_duration,
    non_negative_float,
    positive_duration,
    positive_int,
    server_key,
    threshold_access,
)
from ibe_pubsub.cli.event_feed import (
    BadLine,
    CheckedEvents,
    EventFeed,
    EventSource,
    Schedule,
    is_stream,
)
from ibe_pubsub.cli.peer import _stop_on_signals, _stopped_by
from ibe_pubsub.credentials import notice

if TYPE_CHECKING:
    from ibe_pubsub.client import Publisher
    from ibe_pubsub.peer import PublishedIds


def events_per_second(text: str) -> float:
    """``--rate``: a positive number of events per second."""
    value = non_negative_float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def bad_line_policy(text: str) -> str:
    """``--on-bad-line``, checked as a type so that the configuration file's value is too."""
    if text not in BAD_LINE_POLICIES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(BAD_LINE_POLICIES)}, "
                                         f"got {text!r}")
    return text


BAD_LINE_POLICIES = ("stop", "skip")


def register(subparsers: Any) -> None:
    pub = subparsers.add_parser(
        "publish", help="publish events from a JSON-lines file or a live feed",
        description="Enrol as publisher for --advertise (or take the keys of --bundle), "
                    "check the events of --events against it, encrypt, sign and send each "
                    "to the root of every attribute tree. A regular file is checked whole "
                    "first (nothing is sent if one line is bad). A stream (stdin from a "
                    "pipe, a FIFO) is a live feed: each line is checked and sent as it "
                    "arrives, with one enrolment renewed at every epoch rollover, until the "
                    "input ends or SIGINT/SIGTERM (both flush what is queued first). Exits "
                    "non-zero on any refusal. See docs/feeds.md.")
    add_key_server(pub, threshold=True)
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
                     help='JSON lines {"id": ..., "values": {...}, "body": ...} ("-": stdin); '
                     "a pipe or FIFO is read line by line as lines arrive")
    pub.add_argument("--on-bad-line", type=bad_line_policy, choices=BAD_LINE_POLICIES,
                     help="a line that is not JSON, not an event of the schema, repeats an "
                     "id or lies outside the advertisement: stop (one error line naming it, "
                     "exit non-zero; a regular file is checked before anything is sent, a "
                     "stream stops there, after the events before it) or skip (report it on "
                     "stderr with its line number and go on); default: stop for a regular "
                     "file, skip for a stream")
    pacing = pub.add_mutually_exclusive_group()
    pacing.add_argument("--rate", type=events_per_second, metavar="N",
                        help="send at most N events per second, on a schedule (the k-th is "
                        "due k/N s after the first); a lag of up to 1 s is made up, a longer "
                        "one is not released as a burst (default: as fast as they come)")
    pacing.add_argument("--interval", type=non_negative_float, default=0.0,
                        help="seconds between events, on the same schedule as --rate")
    pub.add_argument("--sent-out", metavar="FILE",
                     help='append {"id", "sent_at"} per sent event (for delay measurements)')
    pub.add_argument("--root-timeout", type=non_negative_float, default=30.0,
                     help="seconds to wait for the roots to register")
    pub.add_argument("--flush-timeout", type=non_negative_float, default=30.0,
                     help="seconds to wait for the roots to take every event")
    pub.add_argument("--server-wait", type=non_negative_duration, default=30.0,
                     metavar="DURATION",
                     help="at an epoch rollover, when the old keys can serve no more, wait up "
                     "to this long for a key server that refuses connections or answers "
                     "502/503/504 (restarting) to issue the new keys, sending nothing "
                     "meanwhile; then stop with an error (default 30s; 0: do not wait)")
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
    from ibe_pubsub.client import Publisher
    from ibe_pubsub.credentials import PredicateError, StreamWindow
    from ibe_pubsub.keyserver import BundleError, KeyServerRequestError
    from ibe_pubsub.peer import (
        EventFileError,
        EventPublisher,
        PeerError,
        PublishRefused,
        read_events,
    )

    period = _period(args)
    if args.stream_max_events is not None and args.stream_window is None:
        raise CommandError("--stream-max-events needs --stream-window")
    try:
        window = (StreamWindow(args.stream_window, args.stream_max_events)
                  if args.stream_window is not None else None)
    except ValueError as exc:  # a window from the configuration file, not through the flag
        raise CommandError(f"--stream-window/--stream-max-events: {exc}") from exc
    stream = is_stream(args.events)
    skip_bad = (args.on_bad_line or ("skip" if stream else "stop")) == "skip"
    deployment = threshold_access(args)
    try:
        publisher = EventPublisher(args.server, args.token, args.advertise,
                                   threshold=deployment,
                                   server_key=None if deployment else server_key(args),
                                   known_servers=None if deployment else known_servers(args),
                                   ca_file=args.ca_file,
                                   insecure_transport=args.insecure_transport,
                                   bundle=args.bundle, stream_window=window)
    except PeerError as exc:
        raise CommandError(str(exc)) from exc
    try:
        await publisher.enrol()
        schema = publisher.service.pp.schema
        source: EventSource
        if stream or skip_bad:
            source = EventFeed(args.events, schema, publisher.advertisement, skip_bad)
        else:  # nothing is sent if one line is bad: check them all first
            events = read_events(args.events, schema, publisher.advertisement)
            _warn_repeated_ids(args, [e.event_id for e in events])
            source = CheckedEvents(events)
        await publisher.find_roots(args.root_timeout)
    except (PredicateError, EventFileError, KeyServerRequestError, BundleError,
            PublishRefused) as exc:
        await publisher.close(0)
        raise CommandError(str(exc)) from exc
    sender = Feed(Publisher(publisher, server_wait=args.server_wait), source, period,
                  args.sent_out, args.flush_timeout)
    stop = asyncio.Event()
    received = _stop_on_signals(stop)
    try:
        await sender.run(stop)
    finally:
        if isinstance(source, EventFeed):  # warned before sending otherwise
            _warn_repeated_ids(args, list(sender.ids))
        _record_ids(args, list(sender.ids))
    mode = " as a stream" if publisher.stream is not None else ""
    skipped = f"; skipped {sender.skipped} bad line(s)" if sender.skipped else ""
    # Read ahead when a signal stopped the run: said, as nothing may be dropped silently.
    unsent = f"; {source.unsent} line(s) read but not sent" if source.unsent else ""
    notice(f"sent {publisher.sent} event(s){mode} to the roots of "
           f"{', '.join(sorted(publisher.roots))}{skipped}{unsent}")
    return _stopped_by(received)


def _period(args: argparse.Namespace) -> float:
    """Seconds between events, from --rate or --interval (0: as fast as they come)."""
    if args.rate is not None and args.interval:
        raise CommandError("give --rate or --interval, not both (one may come from the "
                           "configuration file or the environment)")
    return 1.0 / args.rate if args.rate is not None else args.interval


@dataclass
class Feed:
    """Sends the events of ``source`` through ``publisher`` on schedule, reporting each
    skipped line; keeps one enrolment, its links and stream session for the whole run (the
    publisher renews its keys at each epoch rollover)."""

    publisher: Publisher
    source: EventSource
    period: float
    sent_out: str | None
    flush_timeout: float
    skipped: int = 0
    #: The ids sent, the latest as many as the record of published ids keeps.
    ids: deque[str] = field(default_factory=lambda: deque(maxlen=_remembered_ids()))

    async def run(self, stop: asyncio.Event) -> None:
        """Until the input ends or ``stop`` is set, then hand what is queued to the roots;
        CommandError if a bad line (without skipping) or a refusal ends the run, or if
        events were left unsent."""
        from ibe_pubsub.client import SendFailed

        try:
            await self._send(stop)
        finally:
            try:
                await self.publisher.close(self.flush_timeout)
                flushed = True
            except SendFailed:
                flushed = False
        if not flushed:
            raise CommandError("some events could not be handed to a root")

    async def _send(self, stop: asyncio.Event) -> None:
        from ibe_pubsub.client import ClientError
        from ibe_pubsub.peer import EventFileError

        schedule = Schedule(self.period) if self.period else None
        sent_log = open(self.sent_out, "a", encoding="utf-8") if self.sent_out else None  # noqa: SIM115
        try:
            while (item := await self.source.next(stop)) is not None:
                if isinstance(item, BadLine):
                    self.skipped += 1
                    print(f"ibe-pubsub: skipped {item.error}", file=sys.stderr, flush=True)
                    continue
                if schedule is not None:
                    await schedule.wait(stop)
                await self.publisher.publish(item.values, item.body, item.event_id)
                self.ids.append(item.event_id)
                if sent_log is not None:
                    sent_log.write(json.dumps({"id": item.event_id, "sent_at": time.time()})
                                   + "\n")
                    sent_log.flush()
        except (EventFileError, ClientError) as exc:
            raise CommandError(f"{exc} ({self.publisher.sent} sent before)") from exc
        finally:
            if sent_log is not None:
                sent_log.close()


def _remembered_ids() -> int:
    """Ids a subscriber remembers, and so the record of published ids keeps per publisher."""
    from ibe_pubsub.overlay import OverlayConfig

    return OverlayConfig().dedup_capacity


def _published_ids(args: argparse.Namespace) -> tuple[PublishedIds, str]:
    """The record of ids sent before, and the name of this publisher in it."""
    from ibe_pubsub.peer import PublishedIds, default_published_ids_path, token_publisher

    path = Path(args.published_ids) if args.published_ids else default_published_ids_path()
    return PublishedIds(path), token_publisher(
        _access_text(args) if args.threshold_file else args.token)


def _access_text(args: argparse.Namespace) -> str:
    """What names a publisher of a threshold deployment: its tokens at every member."""
    try:
        return Path(args.threshold_access).read_text()
    except OSError as exc:
        raise CommandError(f"--threshold-access {args.threshold_access}: "
                           f"{exc.strerror or exc}") from exc


def _key_service(args: argparse.Namespace) -> str:
    """The key server, or the threshold deployment, that ids were published under."""
    return args.server or f"threshold:{Path(args.threshold_file).resolve()}"


def _warn_repeated_ids(args: argparse.Namespace, ids: list[str]) -> None:
    """One line if this publisher sent some of ``ids`` to this key server before."""
    from ibe_pubsub.peer import PublishedIdsError

    record, publisher = _published_ids(args)
    try:
        repeated = record.repeated(_key_service(args), publisher, ids)
    except PublishedIdsError as exc:
        print(f"ibe-pubsub: warning: {exc}; re-used event ids go unnoticed", file=sys.stderr)
        return
    if repeated:
        shown = ", ".join(map(repr, repeated[:5])) + (", ..." if len(repeated) > 5 else "")
        print(f"ibe-pubsub: warning: {len(repeated)} of {len(ids)} event id(s) were published "
              f"before by this publisher to {_key_service(args)}: {shown}; subscribers that "
              "delivered them drop these events as duplicates (new ids deliver them again)",
              file=sys.stderr)


def _record_ids(args: argparse.Namespace, ids: list[str]) -> None:
    from ibe_pubsub.peer import PublishedIdsError

    record, publisher = _published_ids(args)
    try:
        record.record(_key_service(args), publisher, ids)
    except PublishedIdsError as exc:
        print(f"ibe-pubsub: warning: {exc}; the ids just sent are not recorded",
              file=sys.stderr)


def cmd_publish(args: argparse.Namespace) -> int:
    if args.advertise is None and args.bundle is None:
        raise CommandError("--advertise PREDICATE (or --bundle FILE) is required")
    if threshold_access(args) is None:
        args.token = identity_token(args)
    return asyncio.run(_publish(args))
