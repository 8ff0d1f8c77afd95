"""What the admin API reads and changes, per project: keys, aliases, adapters, deployments, settings.

The routes (proxy/routes_admin.py) validate and shape answers; the queries are here.
Writers do not commit: the route does, so one request is one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import Adapter, Alias, ApiKey, Deployment, Project, utcnow


async def list_keys(db: AsyncSession, project_id: str) -> Sequence[ApiKey]:
    return (await db.scalars(select(ApiKey).where(ApiKey.project_id == project_id))).all()


async def revoke_key(db: AsyncSession, project_id: str, key_id: str) -> ApiKey | None:
    """Mark a key of this project revoked; None when it has no such key."""
    row = await db.scalar(select(ApiKey).where(ApiKey.id == key_id, ApiKey.project_id == project_id))
    if row is not None:
        row.revoked_at = utcnow()
    return row


async def list_aliases(db: AsyncSession, project_id: str) -> Sequence[Alias]:
    return (await db.scalars(select(Alias).where(Alias.project_id == project_id))).all()


async def add_alias(db: AsyncSession, project_id: str, name: str, base_model: str) -> bool:
    """A new alias of a base model; False when the project has one of that name already."""
    exists = await db.scalar(select(Alias).where(Alias.project_id == project_id, Alias.name == name))
    if exists is not None:
        return False
    db.add(Alias(project_id=project_id, name=name, base_model=base_model))
    return True


async def list_adapters(db: AsyncSession, project_id: str, alias: str | None = None) -> Sequence[Adapter]:
    query = select(Adapter).where(Adapter.project_id == project_id, Adapter.committed())
    if alias:
        query = query.where(Adapter.alias == alias)
    return (await db.scalars(query.order_by(Adapter.alias, Adapter.version))).all()


async def list_deployments(db: AsyncSession, project_id: str, alias: str | None = None) -> Sequence[Deployment]:
    query = select(Deployment).where(Deployment.project_id == project_id)
    if alias:
        query = query.where(Deployment.alias == alias)
    return (await db.scalars(query.order_by(Deployment.id))).all()


async def project_settings(db: AsyncSession, project_id: str) -> dict[str, Any]:
    row = await db.get(Project, project_id)
    return dict(row.settings or {}) if row is not None else {}


async def set_project_setting(db: AsyncSession, project_id: str, key: str, value: Any) -> dict[str, Any]:
    """Replace one top-level setting of a project (created if new); returns all its settings."""
    row = await db.get(Project, project_id)
    if row is None:
        row = Project(id=project_id, settings={})
        db.add(row)
    row.settings = {**(row.settings or {}), key: value}
    return dict(row.settings)
