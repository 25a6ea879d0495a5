"""From an enrolment request to a bundle of keys: policy check, decomposition, issuance.

Shared by the enrolment endpoints and bulk issuance, so both hand out exactly the
same bundle shape for the same credentials.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ibe_pubsub.credentials import (
    Credential,
    OutsidePolicy,
    Predicate,
    PredicateError,
    Schema,
    SchemaError,
    check_within,
    clause_text,
    decompose,
    fine_credentials,
    first_outside,
    parse_predicate,
    virtual_peer_credentials,
)
from ibe_pubsub.keyserver.api_models import (
    MAX_CREDENTIALS,
    MAX_FINE_CREDENTIALS,
    BulkCredential,
)
from ibe_pubsub.keyserver.epochs import Epoch
from ibe_pubsub.keyserver.errors import ApiError
from ibe_pubsub.keyserver.state import AppState


def parse(schema: Schema, text: str, what: str) -> Predicate:
    """422 with the parser's message (and position) for a bad predicate."""
    try:
        return parse_predicate(schema, text)
    except PredicateError as exc:
        raise ApiError(422, f"{what}: {exc.message}", "invalid_predicate",
                       {"position": exc.position}) from exc
    except (SchemaError, ValueError) as exc:
        raise ApiError(422, f"{what}: {exc}", "invalid_predicate") from exc


def stored_policy(schema: Schema, policy: str | None) -> Predicate | None:
    """An identity's parsed policy (None: no policy, everything is allowed)."""
    return None if policy is None else parse(schema, policy, "stored policy")


def within_policy(schema: Schema, text: str, policy: Predicate | None, what: str) -> Predicate:
    """The parsed predicate; 403 naming the offending policy clause if it exceeds it."""
    predicate = parse(schema, text, what)
    if policy is not None:
        clause = check_within(schema, predicate, policy)
        if clause is not None:
            raise ApiError(403, f"{what} exceeds the identity's policy at: {clause}",
                           "outside_policy", {"clause": clause})
    return predicate


def _decompose_inside(schema: Schema, predicate: Predicate, max_credentials: int | None,
                      policy: Predicate | None, what: str) -> list[Credential]:
    """The credentials of ``predicate``, each inside the policy's region (403 if impossible)."""
    try:
        return flat(decompose(schema, predicate, max_credentials, policy))
    except OutsidePolicy as exc:
        raise ApiError(403, f"{what} cannot be served inside the identity's policy: "
                       f"{exc.reason}", "outside_policy",
                       {"clause": exc.clause, "attribute": exc.attribute,
                        "reason": exc.reason}) from exc


def check_issued(schema: Schema, credentials: Iterable[Credential],
                 policy: Predicate | None) -> str | None:
    """Why a credential about to be issued leaves the policy's region, or None if none does.

    The last check before keys are made, whatever produced the credentials.
    """
    outside = first_outside(schema, credentials, policy)
    if outside is None or policy is None:
        return None
    constraint = policy.get(outside.attribute)
    where = "" if constraint is None else f" at: {clause_text(outside.attribute, constraint)}"
    return f"credential {outside} encloses values outside the identity's policy{where}"


def _refuse_outside(schema: Schema, credentials: Iterable[Credential],
                    policy: Predicate | None) -> None:
    problem = check_issued(schema, credentials, policy)
    if problem is not None:
        raise ApiError(403, problem, "outside_policy")


def check_role(role: str, wanted: str) -> None:
    if role != wanted:
        raise ApiError(403, f"a {role} identity cannot enrol as {wanted}", "wrong_role")


def single_server_only(state: AppState, what: str) -> None:
    """409 ``threshold_member`` on a member of a threshold deployment: it answers only with
    its shares (/v3), never with keys or certificates of its own."""
    if state.member is not None:
        raise ApiError(409, f"this key server is member {state.member.index} of the threshold "
                       f"deployment {state.member.plan.deployment!r}: it serves key shares "
                       "(/v3/enrol/subscriber, /v3/enrol/publisher, /v3/enrol/root) and the "
                       f"deployment's public key (/v3/threshold), not version-2 {what}",
                       "threshold_member")


def target_epoch(state: AppState, which: str | int | None, now: float | None = None
                 ) -> Epoch:
    """The current epoch, or the next one during the grace window (409 before it); a
    number names one of those two (409 ``epoch_unavailable`` for any other)."""
    now = time.time() if now is None else now
    current = state.epoch(now)
    if which is None or which == current.number:
        return current
    if isinstance(which, int) and which != current.number + 1:
        raise ApiError(409, f"keys are issued for epoch {current.number} (and "
                       f"{current.number + 1} in its grace window), not {which}",
                       "epoch_unavailable", {"epoch": current.number})
    if not current.in_grace(now):
        raise ApiError(409, f"next-epoch keys are available from "
                       f"{current.end - current.grace:.0f} (Unix time)", "not_in_grace",
                       {"available_from": current.end - current.grace})
    return state.clock.epoch(current.number + 1)


def flat(credentials: Mapping[str, Sequence[Credential]]) -> list[Credential]:
    out = [c for creds in credentials.values() for c in creds]
    if len(out) > MAX_CREDENTIALS:
        raise ApiError(422, f"{len(out)} credentials exceed the limit of {MAX_CREDENTIALS}; "
                       "set max_credentials (`peer run --max-credentials N`) to at most "
                       f"{MAX_CREDENTIALS // len(credentials)} per attribute",
                       "too_many_credentials")
    return out


def plan_subscriber(schema: Schema, predicate: Predicate, max_credentials: int | None,
                    fine_depth: int, policy: Predicate | None = None
                    ) -> tuple[list[Credential], list[Credential]]:
    """Credentials and fine credentials of a subscription, all inside ``policy``."""
    creds = _decompose_inside(schema, predicate, max_credentials, policy, "subscription")
    fine: list[Credential] = []
    if fine_depth:
        fine = [c for cs in fine_credentials(schema, creds, fine_depth).values() for c in cs]
    if len(fine) > MAX_FINE_CREDENTIALS:
        raise ApiError(422, f"{len(fine)} fine credentials exceed the limit of "
                       f"{MAX_FINE_CREDENTIALS}; lower fine_depth (`peer run --fine-depth`, "
                       f"now {fine_depth})", "too_many_credentials")
    _refuse_outside(schema, creds + fine, policy)
    return creds, fine


def plan_publisher(schema: Schema, predicate: Predicate, max_credentials: int | None,
                   policy: Predicate | None = None) -> list[Credential]:
    """Credentials of an advertisement, all inside ``policy``."""
    creds = _decompose_inside(schema, predicate, max_credentials, policy, "advertisement")
    _refuse_outside(schema, creds, policy)
    return creds


def check_root_policy(schema: Schema, attribute: str, policy: str | None) -> None:
    """A root holds the whole domain of its attribute: 403 if the policy constrains it."""
    if policy is None:
        return
    constraint = parse(schema, policy, "stored policy").get(attribute)
    if constraint is not None:
        clause = " and ".join(constraint.clauses(attribute))
        raise ApiError(403, f"the whole domain of {attribute!r} exceeds the identity's policy "
                       f"at: {clause}", "outside_policy", {"clause": clause})


def root_attributes(schema: Schema, policy: str | None) -> tuple[str, ...]:
    """The attributes a root with ``policy`` may serve: those the policy leaves whole, i.e.
    the ones ``check_root_policy`` accepts."""
    parsed = stored_policy(schema, policy)
    return tuple(a for a in schema.names if parsed is None or parsed.get(a) is None)


def joined_trees(schema: Schema, issued: Mapping[str, Sequence[str]]) -> list[str]:
    """The trees a subscriber issued these credentials (labels per attribute) joins, as its
    peer's virtual peers do: those of the attributes it constrains, or the first one."""
    creds = [Credential.from_label(label) for group in issued.values() for label in group]
    return sorted({c.attribute for c in virtual_peer_credentials(schema, creds)})


def labels(credentials: Iterable[Credential]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in credentials:
        out.setdefault(c.attribute, []).append(c.label())
    return out


def parse_bulk_credential(schema: Schema, item: BulkCredential) -> Credential:
    """A credential label from a bulk chunk, checked against the schema (422 otherwise)."""
    try:
        cred = Credential.from_label(item.credential)
        attr = schema.attribute(item.attribute)
    except (ValueError, SchemaError) as exc:
        raise ApiError(422, f"credential {item.credential!r}: {exc}", "invalid_credential") from exc
    limit = attr.bits if attr.is_numeric else attr.max_length
    problem = None
    if cred.attribute != attr.name:
        problem = f"names attribute {cred.attribute!r}, not {attr.name!r}"
    elif cred.kind != attr.kind:
        problem = f"is a {cred.kind} credential but {attr.name!r} is {attr.type}"
    elif len(cred.path) > limit:  # type: ignore[operator]
        problem = f"is longer than {attr.name!r} allows ({limit})"
    elif cred.position != item.position:
        problem = f"has position {cred.position}, not {item.position}"
    if problem:
        raise ApiError(422, f"credential {item.credential!r} {problem}", "invalid_credential")
    return cred


async def issue_bundle(state: AppState, who: str, role: str, epoch: Epoch,
                       credentials: list[Credential], fine: list[Credential]) -> dict[str, Any]:
    """Keys for ``credentials`` in ``epoch``, in the enrolment response shape, issued in the
    fair queue of actor ``who``."""
    base: dict[str, Any] = {"epoch": epoch.number, "epoch_end": epoch.end,
                            "credentials": labels(credentials)}
    if role == "publisher":
        issued = await state.issuer.publisher(who, epoch.number, credentials)
        state.metrics.keys_issued("publisher", len(credentials))
        return base | issued
    expires_at = int(epoch.end + epoch.grace)
    issued = await state.issuer.subscriber(who, epoch.number, credentials, fine, expires_at)
    state.metrics.keys_issued("subscriber_credential", len(credentials))
    state.metrics.keys_issued("routing_token", len(fine))
    state.metrics.keys_issued("connection_request", len(credentials))
    return base | {"expires_at": expires_at, "fine_credentials": labels(fine)} | issued


def issuance_detail(identity: str, role: str, bundle: Mapping[str, Any]) -> dict[str, Any]:
    """What the audit log keeps of an issuance: who, which credentials, which epoch."""
    detail = {"identity": identity, "role": role, "credentials": bundle["credentials"]}
    if bundle.get("fine_credentials"):
        detail["fine_credentials"] = bundle["fine_credentials"]
    return detail
