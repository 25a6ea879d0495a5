"""Initial key server schema: settings, identities, append-only audit log, directory, bulk chunks.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

APPEND_ONLY = "audit log is append-only"


def upgrade() -> None:
    op.create_table(
        "settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=False),
    )
    op.create_table(
        "identities",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("policy", sa.Text(), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("revoked_epoch", sa.Integer(), nullable=True),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_table(
        "directory",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("attribute", sa.String(200), nullable=False),
        sa.Column("address", sa.String(300), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("identity_id", sa.Integer(),
                  sa.ForeignKey("identities.id", ondelete="CASCADE"), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("attribute", "address", name="uq_directory_attribute_address"),
    )
    op.create_index("ix_directory_attribute_expires", "directory", ["attribute", "expires_at"])
    op.create_table(
        "bulk_chunks",
        sa.Column("chunk_id", sa.String(200), primary_key=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("sealed_result", sa.LargeBinary(), nullable=False),
    )
    _protect_audit_log()


def _protect_audit_log() -> None:
    """The database itself refuses UPDATE and DELETE on the audit log."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{APPEND_ONLY}'; END; $$")
        for verb in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log "
                       "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()")
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log "
                       f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END")


def downgrade() -> None:
    for verb in ("update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS audit_log_no_{verb}"
                   + (" ON audit_log" if op.get_bind().dialect.name == "postgresql" else ""))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    op.drop_table("bulk_chunks")
    op.drop_index("ix_directory_attribute_expires", table_name="directory")
    op.drop_table("directory")
    op.drop_table("audit_log")
    op.drop_table("identities")
    op.drop_table("settings")
