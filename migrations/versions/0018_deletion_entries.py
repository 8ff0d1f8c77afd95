"""deletion entries: a delete is an entry of the change log (kind ``deletion``), and tombstones carry its time

A delete writes one ``changes`` row of kind ``deletion`` per session it removed (and one for an
end user, ``session_id`` NULL) in its transaction; every worker's link cache and every change
reader consume them (storage/changes.py). Workers follow them across projects in log order:
this partial index holds those entries alone.

Tombstones keep their columns: ``created_at`` is now the time of the latest delete by the
database's clock, and suppresses only calls made before it (storage/deletion.py). Existing
tombstones keep their times (the proxy's clock when they were written).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

WHERE = sa.text("kind = 'deletion'")


def upgrade() -> None:
    op.create_index("ix_changes_deletions", "changes", ["xid", "seq"], postgresql_where=WHERE, sqlite_where=WHERE)


def downgrade() -> None:
    # Readers before 0018 know calls and feedback only: a deletion entry would read as a session touched.
    op.execute("DELETE FROM changes WHERE kind = 'deletion'")
    op.drop_index("ix_changes_deletions", table_name="changes")
