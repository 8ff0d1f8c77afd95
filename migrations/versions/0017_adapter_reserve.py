"""adapters.state: a publish reserves its version (``reserved``) before its folder is in place

Every row recorded so far is a finished publish, so the column defaults to ``committed``;
rows keep the ``path`` they were written to (readers use it, never a recomputed one).

Revision ID: 0017
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("adapters") as batch:
        batch.add_column(sa.Column("state", sa.String(length=16), server_default="committed", nullable=False))


def downgrade() -> None:
    # A reserved row is a publish that never finished: without the column it would read as a published version.
    op.execute("DELETE FROM adapters WHERE state <> 'committed'")
    with op.batch_alter_table("adapters") as batch:
        batch.drop_column("state")
