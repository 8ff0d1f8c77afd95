"""completions name their dialect and keep the client's own request and response

A call in another API (the Responses API, Anthropic Messages) is translated at the
edge into an engine chat call: ``request``/``response`` stay the engine-facing chat
call that linking, trajectories and exports read; ``client_request`` and
``client_response`` keep what the harness sent and received; ``dialect`` names the
API (``chat`` and ``completions`` for the native routes).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.add_column(sa.Column("dialect", sa.String(length=16), server_default="chat", nullable=False))
        batch.add_column(sa.Column("client_request", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("client_response", sa.JSON(), nullable=True))
    op.execute("UPDATE completions SET dialect = 'completions' WHERE endpoint = 'completions'")


def downgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.drop_column("client_response")
        batch.drop_column("client_request")
        batch.drop_column("dialect")
