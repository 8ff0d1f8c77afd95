"""datasets: named immutable selections of trajectories, their pinned items; used_feedback no longer unique

``used_feedback``'s unique key becomes a plain index: ``train --dataset`` may train items an
alias trained before (a retraining from a dataset), and the new version's lineage records them.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

USED = ["project_id", "alias", "trajectory_id", "feedback_id", "objective"]


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("filter", sa.JSON(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name=op.f("fk_datasets_project_id_projects")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("project_id", "name", name=op.f("uq_datasets_project_id")),
    )
    op.create_table(
        "dataset_items",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=True),
        sa.Column("trajectory_id", sa.String(length=300), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("completion_ids", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("reward_detail", sa.JSON(), nullable=False),
        sa.Column("feedback", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], name=op.f("fk_dataset_items_dataset_id_datasets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_items")),
        sa.UniqueConstraint("dataset_id", "trajectory_id", name=op.f("uq_dataset_items_dataset_id")),
    )
    op.create_index("ix_dataset_items_session", "dataset_items", ["project_id", "session_id"], unique=False)
    with op.batch_alter_table("used_feedback") as batch:
        batch.drop_constraint("uq_used_feedback_project_id", type_="unique")
        batch.create_index("ix_used_feedback_lookup", USED, unique=False)


def downgrade() -> None:
    # A retraining recorded the same key again; the old unique key keeps the first step's row.
    op.execute(f"DELETE FROM used_feedback WHERE id NOT IN (SELECT min(id) FROM used_feedback GROUP BY {', '.join(USED)})")
    with op.batch_alter_table("used_feedback") as batch:
        batch.drop_index("ix_used_feedback_lookup")
        batch.create_unique_constraint("uq_used_feedback_project_id", USED)
    op.drop_index("ix_dataset_items_session", table_name="dataset_items")
    op.drop_table("dataset_items")
    op.drop_table("datasets")
