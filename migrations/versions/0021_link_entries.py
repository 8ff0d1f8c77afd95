"""link entries: the link keys of calls just answered, for the other proxy hosts (proxy/link_feed.py)

While several hosts share the database, each writes a row per call it answered (its link key, session
and id) within milliseconds, beside the call, so that a turn sent to another host finds its parent
before the answering host's recorder has moved the call into ``completions``. Short-lived rows: read
while young, pruned by the host that wrote them, deleted with their sessions.

Revision ID: 0021
Revises: 0020 (0020_shared_prefixes)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "link_entries",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("link_key", sa.String(64), nullable=False),
        sa.Column("call_id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("end_user", sa.String(200), nullable=True),
        sa.Column("created_at", sa.String(40), nullable=True),
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project_id", "link_key", "call_id", name="pk_link_entries"),
    )
    op.create_index("ix_link_entries_written", "link_entries", ["host_id", "written_at"])
    op.create_index("ix_link_entries_session", "link_entries", ["project_id", "session_id"])


def downgrade() -> None:
    op.drop_index("ix_link_entries_session", table_name="link_entries")
    op.drop_index("ix_link_entries_written", table_name="link_entries")
    op.drop_table("link_entries")
