"""``ibe-pubsub keyserver member-key`` and ``keyserver threshold-setup``: a threshold key
service's set-up without a dealer, run by every member's operator at the same time."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ibe_pubsub.cli.arguments import (
    CommandError,
    check_port_free,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from ibe_pubsub.credentials import notice


def _passphrase() -> str:
    from ibe_pubsub.keyserver import KeyStoreError, passphrase_from_env

    try:
        return passphrase_from_env()
    except KeyStoreError as exc:
        raise CommandError(str(exc)) from exc


def cmd_member_key(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import (
        MEMBER_KEY_FILE,
        ThresholdStoreError,
        create_member_key,
        member_key_text,
    )

    try:
        key = create_member_key(Path(args.data), _passphrase())
    except (ThresholdStoreError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"member key sealed in {Path(args.data) / MEMBER_KEY_FILE}; give the key printed on "
          "stdout, with this server's set-up address, to the other operators "
          "(--members KEY@URL,...)", file=sys.stderr)
    print(member_key_text(key))
    return 0


def _listen_address(args: argparse.Namespace, own_url: str) -> tuple[str, int]:
    text = args.listen or urlsplit(own_url).netloc
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit():
        raise CommandError(f"--listen: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def cmd_threshold_setup(args: argparse.Namespace) -> int:
    from ibe_pubsub.credentials import load_group
    from ibe_pubsub.keyserver import (
        SHARES_FILE,
        THRESHOLD_PUBLIC_FILE,
        ServerConfig,
        ServerSettingsError,
        SetupError,
        SetupMember,
        SetupPlan,
        ThresholdStoreError,
        UnsealError,
        check_member_epochs,
        initialised_epochs,
        load_member_key,
        parse_members,
        public_key_fingerprint,
        run_setup,
        save_setup,
    )

    data_dir, passphrase = Path(args.data), _passphrase()
    try:
        if (data_dir / SHARES_FILE).exists():
            raise ThresholdStoreError(f"{data_dir / SHARES_FILE} exists: this server took part "
                                      "in a set-up already")
        plan = SetupPlan(args.deployment, args.threshold, parse_members(args.members),
                         args.epoch_seconds, args.grace_seconds)
        # Before the set-up, not when serving after it: shares sealed under a plan this
        # member cannot serve would need the whole set-up again.
        own = initialised_epochs(ServerConfig(data_dir, database_url=args.database_url))
        if own is not None:
            check_member_epochs(own, plan)
        signing_key = load_member_key(data_dir, passphrase)
        member = SetupMember(load_group(), plan, signing_key)
        host, port = _listen_address(args, plan.members[member.index - 1].url)
        check_port_free(host, port)
        notice(f"threshold set-up of {plan.deployment!r}, {plan.t} of {plan.n}: this server "
               f"is member {member.index}; {plan.epoch_seconds} s epochs, {plan.grace} s grace; "
               f"plan {plan.digest().hex()[:16]} (the same at every member)")
        result = asyncio.run(run_setup(member, host, port, args.timeout, args.linger,
                                       lambda line: notice(f"threshold set-up: {line}")))
        save_setup(data_dir, passphrase, plan, result)
    except (SetupError, ThresholdStoreError, UnsealError, ServerSettingsError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    qualified = "; ".join(f"{name}: {', '.join(map(str, sorted(q)))}"
                          for name, q in result.qualified.items())
    notice(f"threshold set-up done: qualified dealers {qualified}; shares sealed in "
           f"{data_dir / SHARES_FILE}; public outcome in {data_dir / THRESHOLD_PUBLIC_FILE}. "
           "Compare the fingerprint on stdout with every other operator's.")
    print(public_key_fingerprint(result.public_key))
    return 0


def register(sub: Any) -> None:
    """The two commands, under ``keyserver``."""
    member_key = sub.add_parser(
        "member-key", help="create this server's member key for a threshold set-up",
        description="Create --data (mode 0700) and a new Ed25519 member key in it, sealed "
        "under $IBE_PUBSUB_PASSPHRASE (DIR/member.sealed). The key signs this server's "
        "set-up messages; the other operators pin its public half, printed alone on "
        "stdout, in their --members list.")
    member_key.add_argument("--data", required=True, help="data directory of this key server")
    member_key.set_defaults(handler=cmd_member_key)

    setup = sub.add_parser(
        "threshold-setup", help="run the dealer-free set-up of a t-of-n key service",
        description="Run the set-up of a threshold key service with the other members, "
        "each started by its own operator with the same --deployment, --threshold and "
        "--members: the beta ceremony and three distributed key generations (docs/scheme.md "
        "section 16). No process ever holds the master secret. This server serves its "
        "signed messages on its own address in --members (or --listen) and fetches the "
        "others'. It writes DIR/threshold.sealed (this server's shares, sealed) and "
        "DIR/threshold.json (the public outcome, identical at every member: give it to "
        "clients), and prints the public key's fingerprint on stdout.")
    setup.add_argument("--data", required=True,
                       help="data directory holding the member key (keyserver member-key)")
    setup.add_argument("--deployment", required=True,
                       help="the deployment's label, the same at every member")
    setup.add_argument("--threshold", type=positive_int, required=True, metavar="T",
                       help="how many servers must answer for a key (n >= 2T - 1)")
    setup.add_argument("--members", required=True, metavar="KEY@URL,...", type=str,
                       help="every member in order, this one included: its member key "
                       "and the http(s) address where it serves its set-up messages (in a "
                       "TOML file, a list of KEY@URL strings)")
    setup.add_argument("--epoch-seconds", type=positive_int, default=3600,
                       help="the epoch length every member was initialised with (keyserver "
                       "init --epoch-seconds; default 3600): a member refuses to serve with "
                       "another")
    setup.add_argument("--grace-seconds", type=non_negative_int,
                       help="the grace window every member was initialised with (default: "
                       "keyserver init's for that epoch length)")
    setup.add_argument("--database-url",
                       help="the database keyserver init was given (default: SQLite in "
                       "--data), whose epoch settings must be the plan's")
    setup.add_argument("--listen", metavar="HOST:PORT",
                       help="where to serve (default: this member's address in --members)")
    setup.add_argument("--timeout", type=non_negative_float, default=600.0,
                       help="seconds to wait for the other members before giving up")
    setup.add_argument("--linger", type=non_negative_float, default=60.0,
                       help="seconds to keep serving after finishing, until every member "
                       "has finished")
    setup.set_defaults(handler=cmd_threshold_setup)
