"""used feedback: text-feedback examples trained on, per (trajectory, feedback item, objective)

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "used_feedback",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("trajectory_id", sa.String(length=300), nullable=False),
        sa.Column("feedback_id", sa.String(length=200), nullable=False),
        sa.Column("objective", sa.String(length=16), nullable=False),
        sa.Column("step_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name=op.f("fk_used_feedback_project_id_projects")),
        sa.ForeignKeyConstraint(
            ["step_id"], ["training_steps.id"], name=op.f("fk_used_feedback_step_id_training_steps")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_used_feedback")),
        sa.UniqueConstraint(
            "project_id", "alias", "trajectory_id", "feedback_id", "objective", name=op.f("uq_used_feedback_project_id")
        ),
    )


def downgrade() -> None:
    op.drop_table("used_feedback")
