"""Owned directory: who owns each certified peer address, and when an entry was vouched for.

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "peer_addresses",
        sa.Column("address", sa.String(300), primary_key=True),
        sa.Column("identity_id", sa.Integer(),
                  sa.ForeignKey("identities.id", ondelete="CASCADE"), nullable=False),
        sa.Column("certified_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_peer_addresses_identity", "peer_addresses", ["identity_id"])
    op.add_column("directory", sa.Column("vouched_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("directory") as batch:
        batch.drop_column("vouched_at")
    op.drop_index("ix_peer_addresses_identity", table_name="peer_addresses")
    op.drop_table("peer_addresses")
