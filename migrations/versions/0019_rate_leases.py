"""rate leases: each proxy worker's lease on a key's rate limit, so several hosts share one limit

One row per (key, host, worker) renewed about every second with the worker's recent demand, and a
presence row per worker (``key_id`` ``""``); each worker takes its share of the key's limit from
the live rows (proxy/ratelimit.py). Rows are few and short-lived: no history is kept.

Revision ID: 0019
Revises: 0018 (0018_deletion_entries)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_leases",
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.Column("worker", sa.String(64), nullable=False),
        sa.Column("demand", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "host_id", "worker", name="pk_rate_leases"),
    )


def downgrade() -> None:
    op.drop_table("rate_leases")
