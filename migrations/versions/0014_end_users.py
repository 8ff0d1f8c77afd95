"""end users: the caller a call was made for (``user``, ``metadata.user_id``/``end_user``), and end-user tombstones

A deleted end user's calls still in a spool (sessions the database has not seen yet) are
dropped at drain time by the end-user tombstone, as a session's are by its tombstone.

Revision ID: 0014
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("completions", sa.Column("end_user", sa.String(length=200), nullable=True))
    op.create_index("ix_completions_end_user", "completions", ["project_id", "end_user"])
    # Deletion and retention remove a call's change-log entries by its id.
    op.create_index("ix_changes_ref", "changes", ["project_id", "ref_id"])
    op.create_table(
        "end_user_tombstones",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("end_user", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project_id", "end_user", name=op.f("pk_end_user_tombstones")),
    )


def downgrade() -> None:
    op.drop_table("end_user_tombstones")
    op.drop_index("ix_changes_ref", table_name="changes")
    op.drop_index("ix_completions_end_user", table_name="completions")
    op.drop_column("completions", "end_user")
