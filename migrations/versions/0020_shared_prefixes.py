"""shared prefixes: a prefix many calls of one project begin with, stored once (storage/stored_form.py)

``stored_prefixes`` holds, per project, the leading system messages and the large keys (the tool
list) that a harness sends with every call, content-addressed (sha256 of the JSON text) with the
count of ``completions`` rows referencing it. A row in the delta form that begins a chain (a
session's first call, a call whose history does not extend its parent's) references one instead
of holding it. Existing rows are untouched: rows without a reference are read as they are.

Revision ID: 0020
Revises: 0019 (0019_rate_leases)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stored_prefixes",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("refs", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project_id", "hash", name="pk_stored_prefixes"),
    )


def downgrade() -> None:
    # Rows referencing a prefix cannot be read without it: rewrite them in full first
    # (storage/stored_form.py: rewrite_in_full) before going below 0020.
    op.drop_table("stored_prefixes")
