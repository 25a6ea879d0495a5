"""Tree grants: the trees each subscriber was issued credentials of, and until when.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27

A subscriber may look up only the trees of the attributes its credentials constrain; the key
server records them at issuance. Subscribers enrolled before this revision have none until
they fetch their next keys (every epoch), so they may not look up their trees until then.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tree_grants",
        sa.Column("identity_id", sa.Integer(),
                  sa.ForeignKey("identities.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attribute", sa.String(200), primary_key=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tree_grants")
