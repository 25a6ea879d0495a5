"""One identity at every member of a threshold deployment whose admin token the caller
holds: registered (with the same name, role and policy), or revoked.

A member answers shares only for identities registered and allowed there, so an identity
gets keys only once ``t`` members registered it, and stops getting them once ``n - t + 1``
revoked it. Each member keeps its own administrators; an operator who holds some of the
admin tokens registers at those members, the other organisations at theirs. The
identity's tokens go to an *access file* (0600): what :class:`ThresholdKeyClient` needs
to ask the members (:func:`keyserver.threshold_client.read_access_file`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError
from ibe_pubsub.keyserver.keystore import write_private
from ibe_pubsub.keyserver.setup_protocol import SetupPlan
from ibe_pubsub.keyserver.threshold_client import ACCESS_FORMAT
from ibe_pubsub.keyserver.threshold_store import ThresholdStoreError


@dataclass(frozen=True)
class MemberOutcome:
    """What one member did: ``token`` is the identity's token there (registration), and
    ``error`` says why it did nothing."""

    index: int
    url: str
    token: str | None = None
    error: str | None = None


def check_members(plan: SetupPlan, indices: Iterable[int]) -> None:
    """Refuses member numbers the deployment does not have."""
    unknown = sorted(set(indices) - set(range(1, plan.n + 1)))
    if unknown:
        raise ThresholdStoreError(f"members {unknown} are not in the deployment "
                                  f"{plan.deployment!r} (members 1..{plan.n})")


def _members(plan: SetupPlan, admin_tokens: Mapping[int, str]) -> list[tuple[int, str, str]]:
    check_members(plan, admin_tokens)
    return [(i, plan.members[i - 1].url, admin_tokens[i]) for i in sorted(admin_tokens)]


def _at_each(plan: SetupPlan, admin_tokens: Mapping[int, str], verify: Any, timeout: float,
             action: Any) -> list[MemberOutcome]:
    outcomes = []
    for index, url, admin in _members(plan, admin_tokens):
        try:
            with KeyServerClient(url, admin, timeout=timeout, verify=verify) as client:
                outcomes.append(MemberOutcome(index, url, token=action(client)))
        except (KeyServerRequestError, OSError) as exc:
            outcomes.append(MemberOutcome(index, url, error=str(exc) or type(exc).__name__))
    return outcomes


def register_at_members(plan: SetupPlan, admin_tokens: Mapping[int, str], name: str,
                        role: str, policy: str | None = None, verify: Any = True,
                        timeout: float = 30.0) -> list[MemberOutcome]:
    """``name`` registered at each member of ``admin_tokens`` (index -> that member's admin
    token), in member order; a member that refuses or cannot be reached is reported, and
    the others still register it."""
    return _at_each(plan, admin_tokens, verify, timeout,
                    lambda client: client.create_identity(name, role, policy)["token"])


def revoke_at_members(plan: SetupPlan, admin_tokens: Mapping[int, str], name: str,
                      verify: Any = True, timeout: float = 30.0) -> list[MemberOutcome]:
    """``name`` revoked at each member of ``admin_tokens``; a member where it is unknown,
    or that cannot be reached, is reported."""
    def revoke(client: KeyServerClient) -> None:
        identity_id = client.identity_id(name)
        if identity_id is None:
            raise KeyServerRequestError(0, f"no identity named {name!r} at this member")
        client.revoke(identity_id)

    return _at_each(plan, admin_tokens, verify, timeout, revoke)


def write_access_file(path: Path, plan: SetupPlan, fingerprint: str, name: str,
                      outcomes: list[MemberOutcome]) -> None:
    """The identity's tokens at the members that registered it, 0600, never overwritten."""
    document = {"format": ACCESS_FORMAT, "deployment": plan.deployment,
                "fingerprint": fingerprint, "identity": name,
                "members": [{"index": o.index, "url": o.url, "token": o.token}
                            for o in outcomes if o.token is not None]}
    try:
        write_private(path, (json.dumps(document, indent=1) + "\n").encode())
    except FileExistsError as exc:
        raise ThresholdStoreError(f"{path} exists already: give another --access-file, or "
                                  "move it away") from exc
