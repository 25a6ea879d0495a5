"""Database operations of the key server, one short function per query (sync, per session)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from ibe_pubsub.keyserver.db import (
    AuditEntry,
    BulkChunk,
    DirectoryEntry,
    Identity,
    Setting,
    TreeGrant,
)
from ibe_pubsub.keyserver.epochs import (
    DEFAULT_EPOCH_SECONDS,
    RESCHEDULE_LEAD,
    EpochClock,
    default_grace,
    max_grace,
)

EPOCH_SETTING = "epoch_schedule"


def get_setting(session: Session, key: str) -> Any:
    row = session.get(Setting, key)
    return None if row is None else row.value


def put_setting(session: Session, key: str, value: Any) -> None:
    row = session.get(Setting, key)
    if row is None:
        session.add(Setting(key=key, value=value))
    else:
        row.value = value


def load_clock(session: Session, now: float, length: int | None, grace: int | None
               ) -> EpochClock:
    """The stored schedule (started now if there is none), rescheduled if asked to (from a
    boundary far enough away for the other replicas to learn of it first)."""
    stored = get_setting(session, EPOCH_SETTING)
    if stored is None:
        length = length or DEFAULT_EPOCH_SECONDS
        clock = EpochClock.start(now, length, default_grace(length) if grace is None else grace)
    else:
        clock = EpochClock.from_json(stored)
        last = clock.segments[-1]
        if length is not None or grace is not None:
            length = length or last.length
            if grace is None:
                grace = last.grace if last.grace <= max_grace(length) else default_grace(length)
            clock = clock.rescheduled(now, length, grace, RESCHEDULE_LEAD)
    put_setting(session, EPOCH_SETTING, clock.to_json())
    return clock


def audit(session: Session, actor: str, action: str, epoch: int | None,
          detail: dict[str, Any], at: float | None = None) -> None:
    """Append an audit entry; ``at`` (default: now) for entries written after the fact."""
    session.add(AuditEntry(at=time.time() if at is None else at, actor=actor, action=action,
                           epoch=epoch, detail=detail))


def latest_bulk_issuances(session: Session) -> dict[str, dict[str, Any]]:
    """Per identity name, the epoch and credentials of its latest bulk issuance (the audit
    log's ``issue_bulk`` entries), which is all a bulk-only identity may hold."""
    latest: dict[str, dict[str, Any]] = {}
    for entry in session.scalars(select(AuditEntry).where(AuditEntry.action == "issue_bulk")
                                 .order_by(AuditEntry.id)):
        latest[entry.detail["identity"]] = {"epoch": entry.epoch,
                                            "credentials": entry.detail["credentials"]}
    return latest


def audit_entries(session: Session, after: int, limit: int) -> list[AuditEntry]:
    return list(session.scalars(select(AuditEntry).where(AuditEntry.id > after)
                                .order_by(AuditEntry.id).limit(limit)))


def identity_by_token(session: Session, token_hash: str) -> Identity | None:
    return session.scalars(select(Identity).where(Identity.token_hash == token_hash)).first()


def identity_by_name(session: Session, name: str) -> Identity | None:
    return session.scalars(select(Identity).where(Identity.name == name)).first()


def identities(session: Session) -> list[Identity]:
    return list(session.scalars(select(Identity).order_by(Identity.id)))


def remove_directory_entries(session: Session, identity_id: int) -> None:
    """Every entry of the identity, locked in the order vouches lock them (by tree, then
    address), so a removal and a vouch for two of its entries cannot deadlock."""
    for entry in session.scalars(select(DirectoryEntry)
                                 .where(DirectoryEntry.identity_id == identity_id)
                                 .order_by(DirectoryEntry.attribute, DirectoryEntry.address)
                                 .with_for_update()):
        session.delete(entry)


def register_peer(session: Session, identity: Identity, attribute: str, address: str,
                  role: str, expires_at: float) -> DirectoryEntry:
    """Insert or refresh the (attribute, address) entry. An entry left by a former owner of
    the address is taken over without the vouches others gave it."""
    entry = session.scalars(select(DirectoryEntry).where(
        DirectoryEntry.attribute == attribute, DirectoryEntry.address == address)).first()
    if entry is None:
        entry = DirectoryEntry(attribute=attribute, address=address, role=role,
                               identity_id=identity.id, expires_at=expires_at, vouched_at=None)
        session.add(entry)
    else:
        if entry.identity_id != identity.id:
            entry.identity_id, entry.vouched_at = identity.id, None
        entry.role, entry.expires_at = role, expires_at
    return entry


def vouch(session: Session, identity_id: int, attribute: str, addresses: Sequence[str],
          now: float) -> None:
    """Record that the live entries of ``addresses`` in the tree answered ``identity_id``
    just now; entries of the identity itself are left alone (no vouching for oneself). The
    rows are locked in address order first, so that concurrent vouches for overlapping
    neighbours wait for each other instead of deadlocking (SQLite ignores the lock: its
    writes are serialized anyway)."""
    if not addresses:
        return
    vouched = (DirectoryEntry.attribute == attribute, DirectoryEntry.address.in_(addresses),
               DirectoryEntry.identity_id != identity_id, DirectoryEntry.expires_at > now)
    ids = session.scalars(select(DirectoryEntry.id).where(*vouched)
                          .order_by(DirectoryEntry.address).with_for_update()).all()
    if ids:  # the conditions again: an entry taken over meanwhile (SQLite) is left alone
        session.execute(update(DirectoryEntry).where(DirectoryEntry.id.in_(ids), *vouched)
                        .values(vouched_at=now))


def remove_entries_at(session: Session, identity_id: int, address: str) -> None:
    """The identity's entries for ``address`` in every tree."""
    session.execute(delete(DirectoryEntry).where(DirectoryEntry.identity_id == identity_id,
                                                 DirectoryEntry.address == address))


def is_vouched(entry: DirectoryEntry, since: float) -> bool:
    """Roots are certified for their tree; a member once another identity has vouched for it
    since ``since``."""
    return entry.role == "root" or (entry.vouched_at is not None and entry.vouched_at >= since)


def lookup_peers(session: Session, attribute: str, now: float, sample: int,
                 vouched_since: float) -> tuple[list[DirectoryEntry], list[DirectoryEntry]]:
    """Live roots of the tree, and up to ``sample`` of its live other members: a random
    sample of those vouched for since ``vouched_since`` first, then others at random."""
    rows = list(session.scalars(
        select(DirectoryEntry).join(Identity)
        .where(DirectoryEntry.attribute == attribute, DirectoryEntry.expires_at > now,
               Identity.revoked_at.is_(None))
        .order_by(DirectoryEntry.id)))
    roots = [e for e in rows if e.role == "root"]
    vouched = [e for e in rows if e.role != "root" and is_vouched(e, vouched_since)]
    others = [e for e in rows if e.role != "root" and not is_vouched(e, vouched_since)]
    members = random.sample(vouched, min(sample, len(vouched)))
    return roots, members + random.sample(others, min(sample - len(members), len(others)))


def grant_trees(session: Session, identity_id: int, attributes: Iterable[str],
                expires_at: float) -> None:
    """Let the identity look up these trees until ``expires_at``, when the credentials just
    issued for them expire (a grant that lasts longer already is kept). An upsert, so that
    concurrent issuances to one identity cannot collide."""
    rows = [{"identity_id": identity_id, "attribute": a, "expires_at": expires_at}
            for a in sorted(set(attributes))]
    if not rows:
        return
    postgres = session.get_bind().dialect.name == "postgresql"
    statement = (postgresql_insert if postgres else sqlite_insert)(TreeGrant).values(rows)
    later = (func.greatest if postgres else func.max)(TreeGrant.expires_at,
                                                      statement.excluded.expires_at)
    session.execute(statement.on_conflict_do_update(
        index_elements=[TreeGrant.identity_id, TreeGrant.attribute],
        set_={"expires_at": later}))


def holds_tree(session: Session, identity_id: int, attribute: str, now: float) -> bool:
    """Whether the identity holds still valid credentials that join the tree of
    ``attribute``."""
    grant = session.get(TreeGrant, (identity_id, attribute))
    return grant is not None and grant.expires_at > now


def bulk_chunk(session: Session, chunk_id: str) -> BulkChunk | None:
    return session.get(BulkChunk, chunk_id)
