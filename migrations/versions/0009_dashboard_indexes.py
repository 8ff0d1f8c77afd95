"""indexes for the dashboard: calls by alias and by termination, sessions by activity, feedback by time

The traffic list pages newest first (by alias, by termination) and counts calls per
termination, the sessions list pages by last activity, the learning view reads the
newest feedback; at 100,000 calls each was a scan of the whole completions heap
(~2 KB a row) or a sort (bench/ui_paint.py).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_completions_project_alias_created", "completions", ["project_id", "alias", "created_at"])
    op.create_index(
        "ix_completions_project_termination", "completions", ["project_id", "termination", "created_at"]
    )
    op.create_index("ix_sessions_project_updated", "sessions", ["project_id", "updated_at"])
    op.create_index("ix_feedback_project_created", "feedback", ["project_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_feedback_project_created", table_name="feedback")
    op.drop_index("ix_sessions_project_updated", table_name="sessions")
    op.drop_index("ix_completions_project_termination", table_name="completions")
    op.drop_index("ix_completions_project_alias_created", table_name="completions")
