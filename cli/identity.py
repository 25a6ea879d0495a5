"""``ibe-pubsub identity``: the admin's commands against a running key server (``add``,
``list``, ``revoke``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli import threshold_identity
from ibe_pubsub.cli.arguments import CommandError, add_key_server, admin_token

if TYPE_CHECKING:
    from ibe_pubsub.keyserver import KeyServerClient


def _admin_client(args: argparse.Namespace) -> KeyServerClient:
    from ibe_pubsub.keyserver import KeyServerClient

    return KeyServerClient(args.server, admin_token(args), verify=args.ca_file or True)


def _call(args: argparse.Namespace, action: Any) -> Any:
    from ibe_pubsub.keyserver import KeyServerRequestError

    try:
        with _admin_client(args) as client:
            return action(client)
    except KeyServerRequestError as exc:
        raise CommandError(str(exc)) from exc


#: Credentials ``identity list`` shows of a bulk-only identity (``--json`` has them all).
MAX_LABELS = 6


def cmd_identity_add(args: argparse.Namespace) -> int:
    created = _call(args, lambda c: c.create_identity(args.name, args.role, args.allow))
    print(f"identity {created['name']!r} (id {created['id']}, {created['role']}) created; "
          "its token (shown once):", file=sys.stderr)
    print(created["token"])
    return 0


def cmd_identity_list(args: argparse.Namespace) -> int:
    rows = _call(args, lambda c: c.list_identities())
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'id':>5}  {'name':<24} {'role':<10} {'state':<20} policy")
    for r in rows:
        state = f"revoked in epoch {r['revoked_epoch']}" if r["revoked_at"] else "active"
        if r.get("bulk_only"):
            state += ", bulk-only"
        print(f"{r['id']:>5}  {r['name']:<24} {r['role']:<10} {state:<20} {_bounds(r)}")
    return 0


def _bounds(row: dict[str, Any]) -> str:
    """What bounds the identity: its policy, or for one that bulk issuance created (it has
    none, and gets keys only that way) the credentials it was last issued."""
    if not row.get("bulk_only"):
        return row["policy"] or "*"
    issued = row.get("bulk_issued")
    if issued is None:
        return "(bulk: nothing issued yet)"
    labels = [label for labels in issued["credentials"].values() for label in labels]
    shown = " ".join(labels[:MAX_LABELS]) + (f" ... ({len(labels)} in all)"
                                             if len(labels) > MAX_LABELS else "")
    return f"(bulk, epoch {issued['epoch']}) {shown}"


def cmd_identity_revoke(args: argparse.Namespace) -> int:
    def revoke(client: KeyServerClient) -> dict[str, Any]:
        identity_id = args.id if args.id is not None else client.identity_id(args.name)
        if identity_id is None:
            raise CommandError(f"no identity named {args.name!r}")
        return client.revoke(identity_id)

    if (args.id is None) == (args.name is None):
        raise CommandError("give exactly one of --id and --name")
    done = _call(args, revoke)
    print(f"identity {done['name']!r} revoked in epoch {done['revoked_epoch']}", file=sys.stderr)
    return 0


def register(subparsers: Any) -> None:
    identity = subparsers.add_parser("identity", help="manage identities on a key server",
                                     description="Admin commands against a running key server.")
    sub = identity.add_subparsers(dest="identity_command", metavar="COMMAND")

    add = sub.add_parser("add", help="create an identity and print its token",
                         description="Create an identity; prints its bearer token (once).")
    add_key_server(add, admin=True)
    add.add_argument("--name", required=True, help="unique identity name")
    add.add_argument("--role", required=True, choices=("subscriber", "publisher", "root"),
                     help="what the token lets it do: subscriber (`peer run --subscribe`), "
                     "publisher (`publish`) or root (`peer run --root ATTRIBUTE`, the root of "
                     "an attribute's tree, for every attribute its --allow leaves whole)")
    add.add_argument("--allow", help="policy predicate bounding what it may subscribe to or "
                     "advertise (default: anything)")
    add.set_defaults(handler=cmd_identity_add)
    lst = sub.add_parser("list", help="list identities", description="List identities.")
    add_key_server(lst, admin=True)
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(handler=cmd_identity_list)
    rev = sub.add_parser("revoke", help="revoke an identity",
                         description="Revoke an identity: no more keys for it.")
    add_key_server(rev, admin=True)
    rev.add_argument("--id", type=int, help="identity id")
    rev.add_argument("--name", help="identity name")
    rev.set_defaults(handler=cmd_identity_revoke)
    threshold_identity.register(sub)

