"""``ibe-pubsub identity threshold-add`` and ``threshold-revoke``: one identity registered
at, or revoked from, every member of a threshold deployment whose admin token is given."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli.arguments import CommandError, ca_file, read_admin_token_file

if TYPE_CHECKING:
    from ibe_pubsub.keyserver import MemberOutcome, SetupPlan


def _member_token(text: str) -> tuple[int, str]:
    index, sep, path = text.partition("=")
    if not sep or not index.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"expected INDEX=FILE, like 1=member-1/admin.token, "
                                         f"got {text!r}")
    return int(index), path


def _deployment(args: argparse.Namespace) -> tuple[SetupPlan, str, dict[int, str]]:
    """The plan and fingerprint of --deployment, and the admin token of each member given."""
    from ibe_pubsub.credentials import load_group
    from ibe_pubsub.keyserver import (
        ThresholdStoreError,
        check_members,
        public_key_fingerprint,
        read_public_document,
    )

    indices = [index for index, _ in args.admin_token_file]
    if len(set(indices)) != len(indices):
        raise CommandError(f"--admin-token-file names a member twice: {sorted(indices)}")
    try:
        plan, public_key = read_public_document(Path(args.deployment), load_group())
        check_members(plan, indices)
    except ThresholdStoreError as exc:
        raise CommandError(str(exc)) from exc
    tokens = {index: read_admin_token_file(path) for index, path in args.admin_token_file}
    return plan, public_key_fingerprint(public_key), tokens


def _report(outcomes: list[MemberOutcome], verb: str) -> list[int]:
    """One line per member on stderr; the members that failed."""
    for o in outcomes:
        print(f"member {o.index} ({o.url}): {o.error or verb}", file=sys.stderr)
    return [o.index for o in outcomes if o.error]


def cmd_threshold_add(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import ThresholdStoreError, register_at_members, write_access_file

    plan, fingerprint, tokens = _deployment(args)
    access = Path(args.access_file)
    if access.exists():
        raise CommandError(f"{access} exists already: give another --access-file, or move it "
                           "away")
    try:
        outcomes = register_at_members(plan, tokens, args.name, args.role, args.allow,
                                       verify=args.ca_file or True)
        failed = _report(outcomes, "registered")
        registered = len(outcomes) - len(failed)
        if registered:
            write_access_file(access, plan, fingerprint, args.name, outcomes)
    except ThresholdStoreError as exc:
        raise CommandError(str(exc)) from exc
    if registered:
        print(f"{args.name!r} is registered at {registered} of {plan.n} members; its tokens "
              f"are in {access} (0600)", file=sys.stderr)
    if registered < plan.t:
        print(f"fewer than t = {plan.t} members registered {args.name!r}: it gets no keys "
              "until other members' administrators register it too", file=sys.stderr)
    if failed:
        raise CommandError(f"members {failed} did not register {args.name!r} (above)")
    return 0


def cmd_threshold_revoke(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import ThresholdStoreError, revoke_at_members

    plan, _, tokens = _deployment(args)
    try:
        outcomes = revoke_at_members(plan, tokens, args.name, verify=args.ca_file or True)
    except ThresholdStoreError as exc:
        raise CommandError(str(exc)) from exc
    failed = _report(outcomes, "revoked")
    revoked, needed = len(outcomes) - len(failed), plan.n - plan.t + 1
    if revoked < needed:
        print(f"{args.name!r} is revoked at {revoked} members; it stops getting keys once "
              f"{needed} (n - t + 1) have revoked it", file=sys.stderr)
    if failed:
        raise CommandError(f"members {failed} did not revoke {args.name!r} (above)")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deployment", required=True, metavar="FILE",
                        help="the deployment's threshold.json (the same at every member)")
    parser.add_argument("--admin-token-file", required=True, action="append",
                        type=_member_token, metavar="INDEX=FILE",
                        help="member INDEX's admin token file (its DATA/admin.token); "
                        "repeat for each member whose administrator you are")
    parser.add_argument("--name", required=True, help="the identity's name, the same at "
                        "every member (one name must mean one party at every member)")
    parser.add_argument("--ca-file", type=ca_file, metavar="PEM",
                        help="trust the members' TLS certificates if this CA signed them")


def register(sub: Any) -> None:
    add = sub.add_parser(
        "threshold-add", help="register an identity at the members of a threshold deployment",
        description="Register one identity (same name, role and policy) at every member of "
        "a threshold deployment whose admin token is given, and write its tokens to an "
        "access file for ThresholdKeyClient. It gets keys once t members registered it.")
    _common(add)
    add.add_argument("--role", required=True, choices=("subscriber", "publisher", "root"),
                     help="what its tokens let it enrol for (a root: the certificate of its "
                     "transport key and its tree's whole-domain token)")
    add.add_argument("--allow", help="policy predicate bounding what it may subscribe to or "
                     "advertise (default: anything)")
    add.add_argument("--access-file", required=True, metavar="FILE",
                     help="where to write the identity's tokens (a new file, mode 0600)")
    add.set_defaults(handler=cmd_threshold_add)
    revoke = sub.add_parser(
        "threshold-revoke", help="revoke an identity at the members of a threshold deployment",
        description="Revoke one identity at every member whose admin token is given; it "
        "stops getting keys once n - t + 1 members revoked it.")
    _common(revoke)
    revoke.set_defaults(handler=cmd_threshold_revoke)
