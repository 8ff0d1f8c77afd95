"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 11:28:55.431653
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('projects',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('settings', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_projects'))
    )
    op.create_table('aliases',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('base_model', sa.String(length=200), nullable=False),
    sa.Column('deployed_version', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_aliases_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_aliases')),
    sa.UniqueConstraint('project_id', 'name', name=op.f('uq_aliases_project_id'))
    )
    op.create_table('api_keys',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_api_keys_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_project_id'), ['project_id'], unique=False)

    op.create_table('completions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('session_id', sa.String(length=200), nullable=False),
    sa.Column('task_id', sa.String(length=200), nullable=True),
    sa.Column('client_request_id', sa.String(length=200), nullable=True),
    sa.Column('upstream_id', sa.String(length=200), nullable=True),
    sa.Column('endpoint', sa.String(length=32), nullable=False),
    sa.Column('alias', sa.String(length=200), nullable=False),
    sa.Column('served_model', sa.String(length=200), nullable=False),
    sa.Column('adapter_version', sa.Integer(), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('response', sa.JSON(), nullable=True),
    sa.Column('prompt_token_ids', sa.JSON(), nullable=True),
    sa.Column('choices', sa.JSON(), nullable=False),
    sa.Column('sampling', sa.JSON(), nullable=False),
    sa.Column('usage', sa.JSON(), nullable=True),
    sa.Column('status_code', sa.Integer(), nullable=False),
    sa.Column('termination', sa.String(length=32), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('stream', sa.Boolean(), nullable=False),
    sa.Column('link_key', sa.String(length=64), nullable=True),
    sa.Column('parent_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('ttft_ms', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_completions_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_completions'))
    )
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.create_index('ix_completions_client_request', ['project_id', 'client_request_id'], unique=False)
        batch_op.create_index('ix_completions_link_key', ['project_id', 'link_key'], unique=False)
        batch_op.create_index('ix_completions_project_created', ['project_id', 'created_at'], unique=False)
        batch_op.create_index('ix_completions_project_session', ['project_id', 'session_id', 'created_at'], unique=False)

    op.create_table('deployments',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('alias', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=True),
    sa.Column('previous_version', sa.Integer(), nullable=True),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_deployments_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deployments'))
    )
    op.create_table('feedback',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=False),
    sa.Column('target_kind', sa.String(length=32), nullable=False),
    sa.Column('target_id', sa.String(length=200), nullable=False),
    sa.Column('completion_id', sa.String(length=64), nullable=True),
    sa.Column('session_id', sa.String(length=200), nullable=True),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('value', sa.JSON(), nullable=False),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('source', sa.String(length=200), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('attached_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_feedback_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_feedback')),
    sa.UniqueConstraint('project_id', 'idempotency_key', name=op.f('uq_feedback_project_id'))
    )
    with op.batch_alter_table('feedback', schema=None) as batch_op:
        batch_op.create_index('ix_feedback_completion', ['project_id', 'completion_id'], unique=False)
        batch_op.create_index('ix_feedback_session', ['project_id', 'session_id'], unique=False)
        batch_op.create_index('ix_feedback_target', ['project_id', 'target_kind', 'target_id'], unique=False)

    op.create_table('sessions',
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('task_id', sa.String(length=200), nullable=True),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_sessions_project_id_projects')),
    sa.PrimaryKeyConstraint('project_id', 'id', name=op.f('pk_sessions'))
    )
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sessions_task_id'), ['task_id'], unique=False)

    op.create_table('training_runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('alias', sa.String(length=200), nullable=False),
    sa.Column('objective', sa.String(length=16), nullable=False),
    sa.Column('base_model', sa.String(length=200), nullable=False),
    sa.Column('base_sha256', sa.String(length=64), nullable=True),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_training_runs_project_id_projects')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_runs'))
    )
    op.create_table('adapters',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('alias', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('parent_version', sa.Integer(), nullable=True),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('base_model', sa.String(length=200), nullable=False),
    sa.Column('base_sha256', sa.String(length=64), nullable=True),
    sa.Column('training_run_id', sa.Integer(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_adapters_project_id_projects')),
    sa.ForeignKeyConstraint(['training_run_id'], ['training_runs.id'], name=op.f('fk_adapters_training_run_id_training_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_adapters')),
    sa.UniqueConstraint('project_id', 'alias', 'version', name=op.f('uq_adapters_project_id'))
    )
    op.create_table('training_steps',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('adapter_version', sa.Integer(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['training_runs.id'], name=op.f('fk_training_steps_run_id_training_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_steps'))
    )
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_training_steps_run_id'), ['run_id'], unique=False)

    op.create_table('used_trajectories',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('project_id', sa.String(length=64), nullable=False),
    sa.Column('alias', sa.String(length=200), nullable=False),
    sa.Column('trajectory_id', sa.String(length=300), nullable=False),
    sa.Column('step_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_used_trajectories_project_id_projects')),
    sa.ForeignKeyConstraint(['step_id'], ['training_steps.id'], name=op.f('fk_used_trajectories_step_id_training_steps')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_used_trajectories')),
    sa.UniqueConstraint('project_id', 'alias', 'trajectory_id', name=op.f('uq_used_trajectories_project_id'))
    )


def downgrade() -> None:
    op.drop_table('used_trajectories')
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_training_steps_run_id'))

    op.drop_table('training_steps')
    op.drop_table('adapters')
    op.drop_table('training_runs')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sessions_task_id'))

    op.drop_table('sessions')
    with op.batch_alter_table('feedback', schema=None) as batch_op:
        batch_op.drop_index('ix_feedback_target')
        batch_op.drop_index('ix_feedback_session')
        batch_op.drop_index('ix_feedback_completion')

    op.drop_table('feedback')
    op.drop_table('deployments')
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.drop_index('ix_completions_project_session')
        batch_op.drop_index('ix_completions_project_created')
        batch_op.drop_index('ix_completions_link_key')
        batch_op.drop_index('ix_completions_client_request')

    op.drop_table('completions')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_project_id'))

    op.drop_table('api_keys')
    op.drop_table('aliases')
    op.drop_table('projects')
