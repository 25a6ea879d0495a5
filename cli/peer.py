"""``ibe-pubsub peer``: run a subscriber or root peer (``run``) and read a running one's
state (``status``)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli.arguments import (
    CommandError,
    Interrupted,
    add_insecure_transport,
    add_key_server,
    add_log_format,
    identity_token,
    known_servers,
    non_negative_duration,
    non_negative_float,
    non_negative_int,
    positive_int,
    server_key,
    threshold_access,
    write_json_atomically,
)
from ibe_pubsub.cli.delivery_sinks import (
    CommandSink,
    Deliveries,
    FileSink,
    Sink,
    SinkError,
    SocketSink,
)
from ibe_pubsub.credentials import notice
from ibe_pubsub.peer import SOCKET_BUFFER, WaitAnnouncer

if TYPE_CHECKING:
    from ibe_pubsub.peer import PeerNode


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
    from ibe_pubsub.overlay import OverlayConfig
    from ibe_pubsub.peer import NodeError, NodeOptions, PeerNode

    # (every value is checked by its argparse type: no OverlayConfigError is left to catch)
    overlay = OverlayConfig(
        routing=args.routing, max_children=args.max_children,
        heartbeat_interval=args.heartbeat, failure_timeout=args.failure_timeout,
        recruit_rounds=args.recruit_rounds, repair=args.repair,
        push_backup=args.push_backup, demote_after=args.demote_after,
        rotate_interval=args.rotate_interval)
    deployment = threshold_access(args)
    options = NodeOptions(
        server=args.server, token=args.token, threshold=deployment,
        listen=args.listen, subscribe=args.subscribe,
        roots=tuple(args.root or ()), bundle=args.bundle,
        overlay=overlay,
        max_credentials=args.max_credentials, fine_depth=args.fine_depth,
        server_key=None if deployment else server_key(args),
        known_servers=None if deployment else known_servers(args),
        ca_file=args.ca_file, insecure_transport=args.insecure_transport, http=args.http,
        http_allowed_hosts=args.http_allowed_hosts, socket_buffer=args.socket_buffer,
        server_wait=args.server_wait)
    try:
        node = PeerNode(options)
    except NodeError as exc:
        raise CommandError(str(exc)) from exc
    deliveries = Deliveries(_delivery_sinks(args) if not options.roots else [])
    try:
        await deliveries.start()
    except SinkError as exc:
        await deliveries.close()
        raise CommandError(str(exc)) from exc
    node.on_deliver(lambda delivery: deliveries.deliver(delivery.event))
    stop = asyncio.Event()
    received = _stop_on_signals(stop)
    gone = asyncio.get_running_loop().create_task(deliveries.failure.event.wait())
    gone.add_done_callback(lambda _: stop.set())
    try:
        return await _run_started(args, node, stop, received, deliveries)
    finally:
        gone.cancel()
        await deliveries.close()


async def _run_started(args: argparse.Namespace, node: PeerNode, stop: asyncio.Event,
                       received: list[signal.Signals], deliveries: Deliveries) -> int:
    """Start the node, run it until ``stop`` is set, and stop it."""
    from ibe_pubsub.credentials import PredicateError
    from ibe_pubsub.keyserver import BundleError, KeyServerRequestError
    from ibe_pubsub.peer import NodeError, TransportError

    try:
        started = await _start_unless_stopped(node, stop)
    except (NodeError, KeyServerRequestError, BundleError, PredicateError, TransportError) as exc:
        raise CommandError(f"peer could not start: {exc}") from exc
    if not started:
        return _failed_deliveries(deliveries) or _stopped_by(received)

    async def announce() -> None:
        await WaitAnnouncer(f"a parent for every virtual peer in tree(s) "
                            f"{', '.join(node.attributes)}").wait(node.ready.wait())
        notice(f"peer ready at {node.address} in tree(s) {', '.join(node.attributes)}")
        # What start-up made (modules, parameters, keys: most of a peer's objects) is never
        # garbage; out of the collector's sight, a full collection no longer pauses a peer
        # for tens of milliseconds with the events behind it waiting.
        gc.collect()
        gc.freeze()
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
    if args.stats_out:
        write_json_atomically(args.stats_out, node.stats())
    if node.failure is not None:
        raise CommandError(node.failure)
    return _failed_deliveries(deliveries) or _stopped_by(received)


def _delivery_sinks(args: argparse.Namespace) -> list[Sink]:
    """A subscriber's destinations of deliveries: --events-out, --deliver-to-command,
    --deliver-to-socket; stdout if none is given."""
    from ibe_pubsub.peer import EventWriter

    sinks: list[Sink] = []
    if args.deliver_to_command:
        sinks.append(CommandSink(args.deliver_to_command, args.deliver_buffer))
    if args.deliver_to_socket:
        sinks.append(SocketSink(Path(args.deliver_to_socket), args.deliver_buffer))
    if args.events_out or not sinks:
        try:
            writer = EventWriter(args.events_out)
        except OSError as exc:
            raise CommandError(f"cannot open --events-out {args.events_out}: "
                               f"{exc.strerror or exc}") from exc
        sinks.insert(0, FileSink(writer, args.events_out or "stdout"))
    return sinks


def _failed_deliveries(deliveries: Deliveries) -> int:
    """0, or CommandError if deliveries could not go on (the reason the peer stopped)."""
    if deliveries.failure.why is not None:
        raise CommandError(deliveries.failure.why)
    return 0


def _stopped_by(received: list[signal.Signals]) -> int:
    """0 after SIGTERM (a service stopped); after SIGINT, once the peer has left, Ctrl-C is
    reported as for every command ("interrupted", status 130)."""
    if signal.SIGINT in received:
        raise Interrupted
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
    if threshold_access(args) is None:
        args.token = identity_token(args)
    return asyncio.run(_run_peer(args))


def _check_listen(listen: str) -> None:
    """Refuse 0.0.0.0 and [::]: the address is certified and listed in the directory for
    other peers to dial, and nobody can dial "every interface"."""
    from ibe_pubsub.credentials import is_unspecified

    host = listen.rpartition(":")[0]
    if is_unspecified(host):
        raise CommandError(f"--listen must be an address other peers can dial, not {host} "
                           "(every interface): give this machine's address on their network")


def http_address(text: str) -> tuple[str, int]:
    """``--http``: PORT or HOST:PORT (host: 127.0.0.1)."""
    from ibe_pubsub.peer import parse_http

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


def register(subparsers: Any) -> None:
    peer = subparsers.add_parser("peer", help="run a subscriber or root peer",
                                 description="Run peers of the overlay.")
    sub = peer.add_subparsers(dest="peer_command", metavar="COMMAND")
    run = sub.add_parser(
        "run", help="run a peer until interrupted",
        description="Enrol with the key server (or a threshold deployment's members, or "
                    "take the keys of --bundle), join the "
                    "attribute trees and run until "
                    "SIGINT/SIGTERM (then leave gracefully, handing children over). A "
                    "subscriber writes each delivered event as one JSON line "
                    '{"id", "values", "body", "delivered_at"} to --events-out (or stdout).')
    add_key_server(run, threshold=True)
    add_insecure_transport(run)
    run.add_argument("--listen", default="127.0.0.1:0",
                     help="HOST:PORT to accept peers on, an address they can dial (not "
                     "0.0.0.0 or [::]; port 0: the port of an address the key server already "
                     "certified to this identity on HOST, if free, so restarts take no new "
                     "one of its addresses; else any free port)")
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
                     help="credentials per numeric attribute (coarser: fewer virtual peers); "
                     "where the identity's policy needs more to cover the subscription inside "
                     "it, the key server issues the fewest that do")
    run.add_argument("--fine-depth", type=int, choices=range(5), default=1,
                     help="split depth of fine credentials for multi-credential routing")
    run.add_argument("--heartbeat", type=non_negative_float, default=1.0,
                     help="seconds between heartbeats to each parent")
    run.add_argument("--server-wait", type=non_negative_duration, default=30.0,
                     metavar="DURATION",
                     help="at start, wait up to this long in all for a key server that "
                     "refuses connections or answers 502/503/504 (starting, or restarting), "
                     "at each of its steps (first answer, keys, link certificate, directory), "
                     "saying so every few seconds; other errors end the start at once "
                     "(default 30s; 0: do not wait)")
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
    run.add_argument("--push-backup", action=argparse.BooleanOptionalAction, default=None,
                     help="keep a second path from parents on other peers, found by this "
                     "peer's own searches: under ohf a second parent that forwards by the "
                     "same rule as the first and learns what any parent learns; under mcr "
                     "each fine token dealt to two parents, so that with few parents one "
                     "may hold every token (the whole credential; see the scheme's known "
                     "limits) (default: on)")
    run.add_argument("--demote-after", type=int, choices=range(17), metavar="0-16", default=3,
                     help="replace a parent that missed this many of the last 16 events it "
                     "owed (events that came by another path, inside the virtual peer's "
                     "credential, that the parent had not sent 2 s later); 0 turns it off")
    run.add_argument("--rotate-interval", type=non_negative_float, default=10.0,
                     help="with --push-backup, seconds (jittered) between rotations of a "
                     "virtual peer with two parents (under mcr: with one fine token): look "
                     "for a third, then let go of the old one with the least proof of "
                     "delivery, so that two dropping parents cannot hide for ever; 0: never")
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
    run.add_argument("--events-out", metavar="FILE",
                     help="append delivered events here (default: stdout, unless "
                     "--deliver-to-command or --deliver-to-socket is given)")
    run.add_argument("--deliver-to-command", metavar="COMMAND",
                     help="also run COMMAND once (by /bin/sh, in a session of its own) and "
                     "write each delivery to its stdin as one JSON line, e.g. 'jq -c .'; "
                     "if it exits, the peer says so and stops with status 2; when the peer "
                     "stops, its input ends and it has 10 s to finish")
    run.add_argument("--deliver-to-socket", metavar="PATH",
                     help="also listen on a Unix stream socket at PATH (mode 0600: this "
                     "user only) and write each delivery as one JSON line to every "
                     "connected reader, e.g. `socat - UNIX-CONNECT:PATH`")
    run.add_argument("--deliver-buffer", type=positive_int, default=1 << 20, metavar="BYTES",
                     help="bytes of deliveries the command or a socket reader may leave "
                     "unread: beyond that, deliveries to the command are dropped (a warning "
                     "says how many) and a socket reader is disconnected, so a slow "
                     "consumer never stalls the peer")
    run.add_argument("--socket-buffer", type=non_negative_int, default=SOCKET_BUFFER,
                     metavar="BYTES",
                     help="kernel buffer each way per peer connection (0: the kernel's own, "
                     "which grows to megabytes): what a neighbour that stops reading still has "
                     "coming, so it bounds the delay; raise it for links across a WAN, where a "
                     "connection moves at most this much per round trip")
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
