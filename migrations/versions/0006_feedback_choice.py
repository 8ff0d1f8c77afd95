"""feedback.choice: feedback on one choice of an n > 1 call

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedback", sa.Column("choice", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("feedback", "choice")
