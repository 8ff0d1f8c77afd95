"""judge calibrations

Per project and judge configuration (its fingerprint), how the judge agreed with
the grades that exist: judge grades count in training only while the newest
calibration clears the project's agreement gate.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judge_calibrations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("unreadable", sa.Integer(), nullable=False),
        sa.Column("spearman", sa.Float(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("baseline", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name=op.f("fk_judge_calibrations_project_id_projects")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_judge_calibrations")),
    )
    op.create_index(
        "ix_judge_calibrations_lookup", "judge_calibrations", ["project_id", "fingerprint", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_judge_calibrations_lookup", table_name="judge_calibrations")
    op.drop_table("judge_calibrations")
