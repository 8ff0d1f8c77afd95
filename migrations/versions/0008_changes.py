"""the change log: every new call and every new feedback item, in an order readers can page by

A trigger on ``completions`` and one on ``feedback`` append to ``changes`` in the
writing transaction, whatever the insert path (the recorder's COPY, the portable
inserts, the feedback routes, a bulk load). On Postgres each entry carries its
transaction's id; readers take only entries of transactions older than every one
still in flight (storage/changes.py), so a transaction that commits late is never
skipped. ``change_cursors`` keeps each reader's settled position.

Scalar training becomes "used" per (trajectory, feedback item, objective): the rows of
``used_trajectories`` are carried into ``used_feedback`` with feedback id ``*`` (used,
whatever the feedback) and objective ``reward``.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

PG_FUNCTIONS = {
    "completions": "SELECT project_id, 'call', id, session_id FROM inserted",
    "feedback": "SELECT project_id, 'feedback', id, session_id FROM inserted",
}


def upgrade() -> None:
    seq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "changes",
        sa.Column("seq", seq, autoincrement=True, nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ref_id", sa.String(length=200), nullable=False),
        sa.Column("session_id", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_changes")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_changes_position", "changes", ["project_id", "xid", "seq"], unique=False)
    op.create_table(
        "change_cursors",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("consumer", sa.String(length=200), nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project_id", "consumer", name=op.f("pk_change_cursors")),
    )
    if op.get_bind().dialect.name == "postgresql":
        for table, select in PG_FUNCTIONS.items():
            # One statement-level trigger per insert statement (a COPY of 500 calls is one INSERT ... SELECT).
            op.execute(f"""
                CREATE FUNCTION onthejob_log_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  INSERT INTO changes (xid, project_id, kind, ref_id, session_id)
                  SELECT pg_current_xact_id()::text::bigint, c.* FROM ({select}) AS c;
                  RETURN NULL;
                END $$""")
            op.execute(f"""
                CREATE TRIGGER {table}_log_changes AFTER INSERT ON {table}
                REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION onthejob_log_{table}()""")
    else:  # SQLite: row triggers; its writers are serial, so the sequence alone orders them
        for table, kind in (("completions", "call"), ("feedback", "feedback")):
            op.execute(f"""
                CREATE TRIGGER {table}_log_changes AFTER INSERT ON {table} BEGIN
                  INSERT INTO changes (xid, project_id, kind, ref_id, session_id)
                  VALUES (0, NEW.project_id, '{kind}', NEW.id, NEW.session_id);
                END""")
    op.execute(
        "INSERT INTO used_feedback (project_id, alias, trajectory_id, feedback_id, objective, step_id) "
        "SELECT project_id, alias, trajectory_id, '*', 'reward', step_id FROM used_trajectories"
    )


def downgrade() -> None:
    # What was trained with a scalar goes back to used_trajectories (once per trajectory, as it was).
    op.execute(
        "INSERT INTO used_trajectories (project_id, alias, trajectory_id, step_id) "
        "SELECT project_id, alias, trajectory_id, min(step_id) FROM used_feedback u WHERE objective = 'reward' "
        "AND NOT EXISTS (SELECT 1 FROM used_trajectories t WHERE t.project_id = u.project_id "
        "AND t.alias = u.alias AND t.trajectory_id = u.trajectory_id) GROUP BY project_id, alias, trajectory_id"
    )
    op.execute("DELETE FROM used_feedback WHERE objective = 'reward'")
    for table in PG_FUNCTIONS:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_log_changes" + (
            f" ON {table}" if op.get_bind().dialect.name == "postgresql" else ""
        ))
        if op.get_bind().dialect.name == "postgresql":
            op.execute(f"DROP FUNCTION IF EXISTS onthejob_log_{table}()")
    op.drop_table("change_cursors")
    op.drop_index("ix_changes_position", table_name="changes")
    op.drop_table("changes")
