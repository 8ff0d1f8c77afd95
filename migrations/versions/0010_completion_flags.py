"""completion flags: the failure modes ``onthejob mine`` found, one row per completion and mode

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "completion_flags",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("completion_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=200), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("adapter_version", sa.Integer(), nullable=True),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_completion_flags")),
        sa.UniqueConstraint("project_id", "completion_id", "mode", name=op.f("uq_completion_flags_project_id")),
    )
    op.create_index("ix_completion_flags_mode", "completion_flags", ["project_id", "mode"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_completion_flags_mode", table_name="completion_flags")
    op.drop_table("completion_flags")
