"""partial index on pending feedback

The recorder asks, per batch of recorded calls, whether any feedback is still
pending (its target had not landed yet); this index answers that at once, and the
orphan sweep reads the same rows.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

PENDING = sa.text("attached_at IS NULL")


def upgrade() -> None:
    op.create_index("ix_feedback_pending", "feedback", ["project_id"], postgresql_where=PENDING, sqlite_where=PENDING)


def downgrade() -> None:
    op.drop_index("ix_feedback_pending", table_name="feedback")
