"""Identities created by bulk issuance are marked: they get keys only that way.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Such an identity has no policy, so enrolling by token would let it enrol anything; the
enrolment endpoints refuse it. Identities that bulk issuance created before this revision
are found by their ``create_identity`` audit entry (``"via": "bulk"``).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _created_by_bulk(bind: sa.engine.Connection) -> list[str]:
    rows = bind.execute(sa.text("SELECT detail FROM audit_log "
                                "WHERE action = 'create_identity'")).scalars()
    details = [json.loads(d) if isinstance(d, str) else d for d in rows]
    return [d["identity"] for d in details if d.get("via") == "bulk"]


def upgrade() -> None:
    op.add_column("identities", sa.Column("bulk_only", sa.Boolean(), nullable=False,
                                          server_default=sa.false()))
    bind = op.get_bind()
    names = _created_by_bulk(bind)
    if names:
        bind.execute(sa.text("UPDATE identities SET bulk_only = :yes WHERE name IN :names")
                     .bindparams(sa.bindparam("names", expanding=True)),
                     {"yes": True, "names": names})


def downgrade() -> None:
    with op.batch_alter_table("identities") as batch:
        batch.drop_column("bulk_only")
