"""promotion: evals per version, promotion policies and events, attestations, the served adapter's hash

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name=op.f(f"fk_{table}_project_id_projects"))


def upgrade() -> None:
    op.add_column("completions", sa.Column("adapter_sha256", sa.String(length=64), nullable=True))
    op.create_table(
        "evals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("grader", sa.String(length=200), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=False),
        sa.Column("stderr", sa.Float(), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _fk("evals"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evals")),
    )
    op.create_index("ix_evals_lookup", "evals", ["project_id", "alias", "name", "version"], unique=False)
    op.create_table(
        "promotion_policies",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("candidate_version", sa.Integer(), nullable=True),
        sa.Column("candidate_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        _fk("promotion_policies"),
        sa.PrimaryKeyConstraint("project_id", "alias", name=op.f("pk_promotion_policies")),
    )
    op.create_table(
        "promotion_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("serving_version", sa.Integer(), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("decision", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _fk("promotion_events"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_promotion_events")),
    )
    op.create_index("ix_promotion_events_alias", "promotion_events", ["project_id", "alias", "id"], unique=False)
    op.create_table(
        "attestations",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("replica", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _fk("attestations"),
        sa.PrimaryKeyConstraint("project_id", "alias", "version", name=op.f("pk_attestations")),
    )


def downgrade() -> None:
    op.drop_table("attestations")
    op.drop_index("ix_promotion_events_alias", table_name="promotion_events")
    op.drop_table("promotion_events")
    op.drop_table("promotion_policies")
    op.drop_index("ix_evals_lookup", table_name="evals")
    op.drop_table("evals")
    op.drop_column("completions", "adapter_sha256")
