"""Commands: ``peer run``, ``peer status``, ``publish`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli.arguments import (
    CommandError,
    add_ca_file,
    add_insecure_transport,
    add_log_format,
    bench_group,
    non_negative_float,
    non_negative_int,
    positive_duration,
    positive_int,
    write_json_atomically,
)
from ibe_pubsub.credentials.logsafe import notice
from ibe_pubsub.peer.waiting import WaitAnnouncer

if TYPE_CHECKING:
    from ibe_pubsub.peer.known_servers import KnownServers
    from ibe_pubsub.peer.node import PeerNode
    from ibe_pubsub.peer.published_ids import PublishedIds


def _server_key(text: str | None) -> bytes | None:
    if not text:
        return None
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CommandError("--server-key must be base64") from exc
    if len(key) != 32:
        raise CommandError("--server-key must be a raw 32-byte Ed25519 key in base64")
    return key


def _known_servers(args: argparse.Namespace) -> KnownServers | None:
    """Where first-use keys are recorded; none is consulted when --server-key pins the key."""
    from ibe_pubsub.peer.known_servers import KnownServers, default_path

    if args.server_key:
        return None
    return KnownServers(Path(args.known_servers) if args.known_servers else default_path())


def _token(args: argparse.Namespace) -> str:
    """--token (or IBE_PUBSUB_TOKEN), else the token in the --bundle file, if it has one."""
    if args.token:
        return str(args.token)
    if args.bundle is None:
        raise CommandError("--token (or IBE_PUBSUB_TOKEN) is required")
    from ibe_pubsub.keyserver.bundles import BundleError
    from ibe_pubsub.peer.bundle_file import file_token

    try:
        token = file_token(args.bundle)
    except BundleError as exc:
        raise CommandError(str(exc)) from exc
    if token is None:
        raise CommandError(f"bundle {args.bundle} carries no token (its identity was not "
                           "created by bulk issuance): give the identity's token with --token "
                           "or IBE_PUBSUB_TOKEN")
    return token


def _stop_on_signals(stop: asyncio.Event) -> list[signal.Signals]:
    """Set ``stop`` on SIGTERM or SIGINT; the returned list collects the signals received."""
    received: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handle, sig)
    return received


async def _start_unless_stopped(node: PeerNode, stop: asyncio.Event) -> bool:
    """``node.start()``, abandoned as soon as ``stop`` is set (a signal), since starting can
    wait long for the key server or for a root; whether the node started."""
    starting = asyncio.ensure_future(node.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if starting.done():
        starting.result()  # raises what stopped the start
        return True
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    await node.stop()
    return False


# -- peer run ------------------------------------------------------------------------------

async def _run_peer(args: argparse.Namespace) -> int:
    from ibe_pubsub.credentials.predicates import PredicateError
    from ibe_pubsub.keyserver.bundles import BundleError
    from ibe_pubsub.keyserver.client import KeyServerError
    from ibe_pubsub.overlay.config import OverlayConfig
    from ibe_pubsub.peer.events_io import EventWriter
    from ibe_pubsub.peer.node import NodeError, NodeOptions, PeerNode
    from ibe_pubsub.peer.transport import TransportError

    options = NodeOptions(
        server=args.server, token=args.token, listen=args.listen, subscribe=args.subscribe,
        roots=tuple(args.root or ()), bundle=args.bundle,
        overlay=OverlayConfig(routing=args.routing, max_children=args.max_children,
                              heartbeat_interval=args.heartbeat,
                              failure_timeout=args.failure_timeout,
                              recruit_rounds=args.recruit_rounds, repair=args.repair),
        max_credentials=args.max_credentials, fine_depth=args.fine_depth,
        server_key=_server_key(args.server_key), known_servers=_known_servers(args),
        ca_file=args.ca_file, insecure_transport=args.insecure_transport, http=args.http,
        http_allowed_hosts=args.http_allowed_hosts)
    try:
        node = PeerNode(options)
    except NodeError as exc:
        raise CommandError(str(exc)) from exc
    writer = EventWriter(args.events_out) if not options.roots else None
    if writer is not None:
        node.on_deliver(writer.write)
    stop = asyncio.Event()
    received = _stop_on_signals(stop)
    try:
        started = await _start_unless_stopped(node, stop)
    except (NodeError, KeyServerError, BundleError, PredicateError, TransportError) as exc:
        raise CommandError(f"peer could not start: {exc}") from exc
    if not started:
        if writer is not None:
            writer.close()
        return 130 if signal.SIGINT in received else 0

    async def announce() -> None:
        await WaitAnnouncer(f"a parent for every virtual peer in tree(s) "
                            f"{', '.join(node.attributes)}").wait(node.ready.wait())
        notice(f"peer ready at {node.address} in tree(s) {', '.join(node.attributes)}")
        if args.ready_file:
            monitor = node.monitor.url if node.monitor is not None else None
            write_json_atomically(args.ready_file, {"address": node.address,
                                                     "pid": os.getpid(),
                                                     "attributes": node.attributes,
                                                     "join_seconds": node.join_seconds,
                                                     "http": monitor})

    announcer = asyncio.get_running_loop().create_task(announce())
    failed = asyncio.get_running_loop().create_task(node.failed.wait())
    failed.add_done_callback(lambda _: stop.set())
    await stop.wait()
    announcer.cancel()
    failed.cancel()
    await node.stop()
    if writer is not None:
        writer.close()
    if args.stats_out:
        write_json_atomically(args.stats_out, node.stats())
    if node.failure is not None:
        raise CommandError(node.failure)
    return 0


def cmd_peer_run(args: argparse.Namespace) -> int:
    if (args.subscribe is None and args.bundle is None) == (not args.root):
        raise CommandError("give exactly one of --subscribe PREDICATE (and/or --bundle "
                           "FILE: a subscriber) or --root ATTRIBUTE (a root)")
    _check_listen(args.listen)
    if args.http is not None and not isinstance(args.http, tuple):  # a TOML number
        try:
            args.http = http_address(str(args.http))
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"--http: {exc}") from exc
    if isinstance(args.http_allowed_hosts, list):  # a TOML list
        args.http_allowed_hosts = host_names(",".join(map(str, args.http_allowed_hosts)))
    args.token = _token(args)
    return asyncio.run(_run_peer(args))


def _check_listen(listen: str) -> None:
    """Refuse 0.0.0.0 and [::]: the address is certified and listed in the directory for
    other peers to dial, and nobody can dial "every interface"."""
    from ibe_pubsub.credentials.peer_certificates import is_unspecified

    host = listen.rpartition(":")[0]
    if is_unspecified(host):
        raise CommandError(f"--listen must be an address other peers can dial, not {host} "
                           "(every interface): give this machine's address on their network")


def http_address(text: str) -> tuple[str, int]:
    """``--http``: PORT or HOST:PORT (host: 127.0.0.1)."""
    from ibe_pubsub.peer.monitor import parse_http

    try:
        return parse_http(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def host_names(text: str) -> tuple[str, ...]:
    """``--http-allowed-hosts``: NAME[,NAME...]."""
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    if any(not n.replace("-", "").replace(".", "").isalnum() for n in names):
        raise argparse.ArgumentTypeError(f"expected host names separated by commas, got "
                                         f"{text!r}")
    return names


# -- peer status ---------------------------------------------------------------------------

def cmd_peer_status(args: argparse.Namespace) -> int:
    from ibe_pubsub.cli.status_view import StatusError, fetch_status, status_lines

    try:
        status = fetch_status(args.url)
    except StatusError as exc:
        raise CommandError(str(exc)) from exc
    print("\n".join(status_lines(status)))
    return 0


# -- publish -------------------------------------------------------------------------------

async def _publish(args: argparse.Namespace) -> int:
    from ibe_pubsub.credentials.predicates import PredicateError
    from ibe_pubsub.credentials.streams import StreamWindow
    from ibe_pubsub.keyserver.bundles import BundleError
    from ibe_pubsub.keyserver.client import KeyServerError
    from ibe_pubsub.peer.events_io import EventFileError, read_events
    from ibe_pubsub.peer.publisher import EventPublisher, PublishRefused

    if args.stream_max_events is not None and args.stream_window is None:
        raise CommandError("--stream-max-events needs --stream-window")
    try:
        window = (StreamWindow(args.stream_window, args.stream_max_events)
                  if args.stream_window is not None else None)
    except ValueError as exc:  # a window from the configuration file, not through the flag
        raise CommandError(f"--stream-window/--stream-max-events: {exc}") from exc
    publisher = EventPublisher(args.server, args.token, args.advertise,
                               server_key=_server_key(args.server_key),
                               known_servers=_known_servers(args), ca_file=args.ca_file,
                               insecure_transport=args.insecure_transport, bundle=args.bundle,
                               stream_window=window)
    try:
        await publisher.enrol()
        assert publisher.params is not None
        events = read_events(args.events, publisher.params.pp.schema, publisher.advertisement)
        _warn_repeated_ids(args, [e.event_id for e in events])
        await publisher.find_roots(args.root_timeout)
    except (PredicateError, EventFileError, KeyServerError, BundleError, PublishRefused) as exc:
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
    from ibe_pubsub.peer.published_ids import PublishedIds, default_path, token_publisher

    path = Path(args.published_ids) if args.published_ids else default_path()
    return PublishedIds(path), token_publisher(args.token)


def _warn_repeated_ids(args: argparse.Namespace, ids: list[str]) -> None:
    """One line if this publisher sent some of ``ids`` to this key server before."""
    from ibe_pubsub.peer.published_ids import PublishedIdsError

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
    from ibe_pubsub.peer.published_ids import PublishedIdsError

    record, publisher = _published_ids(args)
    try:
        record.record(args.server, publisher, ids)
    except PublishedIdsError as exc:
        print(f"ibe-pubsub: warning: {exc}; the ids just sent are not recorded",
              file=sys.stderr)


def cmd_publish(args: argparse.Namespace) -> int:
    if args.advertise is None and args.bundle is None:
        raise CommandError("--advertise PREDICATE (or --bundle FILE) is required")
    args.token = _token(args)
    return asyncio.run(_publish(args))


# -- demo ----------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.demo import DemoError, run_demo

    try:
        report = run_demo(peers=args.peers, routing=args.routing, events=args.events,
                          seed=args.seed, workdir=args.workdir, max_children=args.max_children,
                          insecure_transport=args.insecure_transport, graph=args.graph)
    except DemoError as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1


# -- bench transport -----------------------------------------------------------------------

def cmd_bench_transport(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.bench_transport import bench_transport

    result = bench_transport(args.connections)
    print(f"{result['connections']} connections on loopback: mutual TLS "
          f"{result['tls_ms']:.2f} ms, plaintext {result['plaintext_ms']:.2f} ms per "
          f"connection (+{result['tls_overhead_ms']:.2f} ms)", file=sys.stderr)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(args.json, result)
    print(f"wrote {args.json}")
    return 0


# -- bench monitoring ----------------------------------------------------------------------

def cmd_bench_monitoring(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.bench_monitoring import bench_monitoring, plot

    result = bench_monitoring(args.pairs, args.events, args.interval, args.scrape_interval)
    notice(f"--http on/off: CPU x{result['window_cpu_ratio_on_off']:.3f} while "
           f"disseminating (x{result['cpu_ratio_on_off']:.3f} over the processes' lives), "
           f"mean delay "
           f"{result['on']['delay_ms_mean']:.1f} vs {result['off']['delay_ms_mean']:.1f} ms "
           f"({result['scrapes']} scrapes); one scrape costs a peer "
           f"{1000 * result['cpu_seconds_per_scrape']:.2f} ms CPU, "
           f"{result['scrape_cpu_share']:.2%} of its CPU at one scrape per interval")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(args.json, result)
    plot(result, Path(args.json).with_suffix(".png"))
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


# -- registration --------------------------------------------------------------------------

def _connection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", required=True, help="key server URL, e.g. http://127.0.0.1:8700")
    p.add_argument("--token", help="the identity's bearer token (better: IBE_PUBSUB_TOKEN)")
    p.add_argument("--server-key", help="pin the key server's Ed25519 signing key (base64); "
                   "default: trust the key it presents on first contact and refuse another "
                   "one later (see --known-servers)")
    p.add_argument("--known-servers", metavar="FILE",
                   help="where key servers' keys are recorded on first contact (default: "
                   "ibe-pubsub/known_servers.json in $XDG_CONFIG_HOME or ~/.config)")
    add_ca_file(p)
    add_insecure_transport(p)


def register(subparsers: Any) -> None:
    peer = subparsers.add_parser("peer", help="run a subscriber or root peer",
                                 description="Run peers of the overlay.")
    sub = peer.add_subparsers(dest="peer_command", metavar="COMMAND")
    run = sub.add_parser(
        "run", help="run a peer until interrupted",
        description="Enrol with the key server (or take the keys of --bundle), join the "
                    "attribute trees and run until "
                    "SIGINT/SIGTERM (then leave gracefully, handing children over). A "
                    "subscriber writes each delivered event as one JSON line "
                    '{"id", "values", "body", "delivered_at"} to --events-out (or stdout).')
    _connection_options(run)
    run.add_argument("--listen", default="127.0.0.1:0",
                     help="HOST:PORT to accept peers on, an address they can dial (not "
                     "0.0.0.0 or [::]; port 0: any free port)")
    run.add_argument("--subscribe", metavar="PREDICATE",
                     help='subscribe, e.g. \'symbol prefix "IB" and price < 100\'')
    run.add_argument("--root", action="append", metavar="ATTRIBUTE",
                     help="be the root of this attribute's tree (repeatable)")
    run.add_argument("--bundle", metavar="FILE",
                     help="a subscriber's bundle from `bulk issue`: its keys instead of "
                     "enrolling, and its token unless --token is given; delivers the events "
                     "its credentials enclose (a --subscribe inside them narrows that). "
                     "The file is re-read before the keys expire: put the next epoch's "
                     "bundle there, or the peer stops when they expire")
    run.add_argument("--routing", choices=("ohf", "mcr"), default="ohf",
                     help="one-hop flooding or multi-credential routing (same for all peers)")
    run.add_argument("--max-children", type=positive_int, default=4,
                     help="children per virtual peer")
    run.add_argument("--max-credentials", type=positive_int, default=4,
                     help="credentials per numeric attribute (coarser: fewer virtual peers)")
    run.add_argument("--fine-depth", type=int, choices=range(5), default=1,
                     help="split depth of fine credentials for multi-credential routing")
    run.add_argument("--heartbeat", type=non_negative_float, default=1.0,
                     help="seconds between heartbeats to each parent")
    run.add_argument("--failure-timeout", type=non_negative_float, default=10.0,
                     help="a neighbour silent this long is taken for failed")
    run.add_argument("--recruit-rounds", type=non_negative_int, default=3,
                     help="after attaching, rounds (5 s apart) of asking the parent for finer "
                     "peers this one covers, to deepen the tree; 0 turns it off")
    repair = run.add_mutually_exclusive_group()
    repair.add_argument("--repair", dest="repair", action="store_true", default=None,
                        help="ask covering ancestors for digests of recent events and pull "
                        "those a parent failed to forward (default: on under mcr, off under "
                        "ohf, where an active ancestor could learn this peer's exact "
                        "credentials from what it pulls)")
    repair.add_argument("--no-repair", dest="repair", action="store_false", default=None,
                        help="do not (see --repair)")
    run.add_argument("--http", type=http_address, metavar="[HOST:]PORT",
                     help="serve /healthz, /metrics (Prometheus) and /status (JSON) over HTTP "
                     "here (host default 127.0.0.1; port 0: any free port, named in "
                     "--ready-file, as a loopback URL for a wildcard host); off unless "
                     "given; at most 64 connections at once, each closed unless it completes "
                     "a request within 5 s")
    run.add_argument("--http-allowed-hosts", type=host_names, default=(), metavar="NAMES",
                     help="host names (comma-separated) the --http endpoint answers to, "
                     "besides IP addresses, localhost and its own host: another Host header "
                     "gets 421 (a guard against DNS rebinding); e.g. the name a scraper "
                     "uses (default: none)")
    add_log_format(run)
    run.add_argument("--events-out", metavar="FILE", help="append delivered events here")
    run.add_argument("--ready-file", metavar="FILE",
                     help="write {address, pid, attributes, join_seconds, http} as JSON here "
                     "once joined")
    run.add_argument("--stats-out", metavar="FILE",
                     help="write the peer's counters as JSON here when it stops (each "
                     "field is described in docs/events.md)")
    run.set_defaults(handler=cmd_peer_run)

    status = sub.add_parser(
        "status", help="show a running peer's trees and links",
        description="Read /status from a peer's --http endpoint and print its identity, "
                    "role, epoch and key expiry, then one line per tree: virtual peers with "
                    "their positions and depths, parents, children and relays.")
    status.add_argument("url", metavar="URL",
                        help="the peer's endpoint, e.g. http://127.0.0.1:9464 or "
                        "127.0.0.1:9464 (any path is replaced by /status)")
    status.set_defaults(handler=cmd_peer_status)

    pub = subparsers.add_parser(
        "publish", help="publish events from a JSON-lines file",
        description="Enrol as publisher for --advertise (or take the keys of --bundle), "
                    "check every event of --events "
                    "against it (nothing is sent if one lies outside), encrypt, sign and send "
                    "each to the root of every attribute tree. Exits non-zero on any refusal.")
    _connection_options(pub)
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
                     help="publish as a stream (off by default): an attribute's ciphertext "
                     "entry is reused while the value stays in its credential cell, for up "
                     "to DURATION (e.g. 1s, 250ms). Much cheaper for fast feeds, but events "
                     "that share an entry are linkable by that cell within the window, and "
                     "the events of one run by its session key (docs/scheme.md, Streams)")
    pub.add_argument("--stream-max-events", type=positive_int, metavar="N",
                     help="with --stream-window: reuse an entry for at most N events")
    pub.set_defaults(handler=cmd_publish)

    demo = subparsers.add_parser(
        "demo", help="run a whole overlay on this machine and check every delivery",
        description="Start a key server (temporary directory, SQLite, loopback), one root "
                    "peer per attribute, --peers subscriber processes with varied "
                    "subscriptions and one publisher process; publish a stream of stock "
                    "quotes; print per subscriber the events delivered and expected, false "
                    "positives filtered and the mean delivery delay. Exits 1 if any "
                    "subscriber missed an event or got one it should not have.")
    demo.add_argument("--peers", type=positive_int, default=8, help="subscriber processes")
    demo.add_argument("--routing", choices=("ohf", "mcr"), default="ohf",
                      help="one-hop flooding or multi-credential routing")
    demo.add_argument("--events", type=positive_int, default=60, help="events to publish")
    demo.add_argument("--max-children", type=positive_int, default=3,
                      help="children per virtual peer (small: deeper trees)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the generated workload")
    demo.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    demo.add_argument("--graph", metavar="FILE.png",
                      help="draw the attribute trees as the peers report them at the end "
                      "of the run (one panel per attribute, nodes coloured by peer)")
    add_insecure_transport(demo)
    demo.add_argument("--workdir", metavar="DIR",
                      help="keep logs and files here (default: a temporary directory)")
    demo.set_defaults(handler=cmd_demo)

    transport = bench_group(subparsers).add_parser(
        "transport", help="the cost of opening an authenticated peer link",
        description="Open --connections fresh peer links on loopback, each one TCP connect, "
                    "a mutual TLS 1.3 handshake with Ed25519 certificates from a throwaway "
                    "CA, HELLO both ways and a first frame, then the same in plaintext; "
                    "prints the mean milliseconds per connection and writes them to --json.")
    transport.add_argument("--connections", type=positive_int, default=200,
                           help="connections per mode")
    transport.add_argument("--json", default="bench/transport.json", metavar="FILE",
                           help="output JSON file")
    transport.set_defaults(handler=cmd_bench_transport)

    monitoring = bench_group(subparsers).add_parser(
        "monitoring", help="the cost of a peer's --http endpoint, scraped, in CPU and delay",
        description="One overlay on loopback with subscribers in pairs of equal "
                    "subscriptions, one of each pair serving --http and scraped (/metrics and "
                    "/status) every --scrape-interval, the other not; publishes --events and "
                    "compares the pairs' CPU seconds (process time) and dissemination delay.")
    monitoring.add_argument("--pairs", type=positive_int, default=10,
                            help="subscriber pairs")
    monitoring.add_argument("--events", type=positive_int, default=300, help="events")
    monitoring.add_argument("--interval", type=non_negative_float, default=0.05,
                            help="seconds between events")
    monitoring.add_argument("--scrape-interval", type=positive_duration, default=15.0,
                            metavar="DURATION", help="time between scrapes of each peer "
                            "(default 15s, a usual Prometheus setting)")
    monitoring.add_argument("--json", default="bench/monitoring.json", metavar="FILE",
                            help="output JSON file (the PNG goes next to it)")
    monitoring.set_defaults(handler=cmd_bench_monitoring)
