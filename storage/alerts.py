"""Alerts: a version of an alias that should not spread until someone looks at it.

Raised by the monitors (``storage.monitors``: a window moved beyond its threshold from the
predecessor's) and by attestation (the engine served other weights than the version names).
Read by promotion (``open_alerts``: an open alert on a candidate holds its promotion, and under
``canary`` rolls it back), by ``GET /v1/admin/alerts`` and by the proxy's ``/metrics``.

One open row per (project, alias, version, kind, name): seeing the same breach again refreshes
that row (value, ``last_seen_at``), so a monitor that runs every minute does not pile up rows.
An alert stays open until an admin resolves it (``POST /v1/admin/alerts/{id}/resolve``): a
window that drifts back under its threshold does not clear it by itself, because the policy
that moved it once is still the one serving. Writers do not commit; the caller does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import Alert, utcnow

log = logging.getLogger("onthejob.alerts")

KINDS = ("monitor", "attestation")


async def open_alerts(db: AsyncSession, project_id: str, alias: str, version: int | None) -> list[Alert]:
    """The open alerts of one alias version, oldest first; ``version=None``: of every version of the alias.

    The base model has no predecessor, so monitors never raise on it; an alert row about the
    base model itself (``Alert.version`` NULL) is returned only under ``version=None``.
    """
    query = select(Alert).where(Alert.project_id == project_id, Alert.alias == alias, Alert.resolved_at.is_(None))
    if version is not None:
        query = query.where(Alert.version == version)
    return list((await db.scalars(query.order_by(Alert.id))).all())


async def list_alerts(
    db: AsyncSession, project_id: str, *, alias: str | None = None, include_resolved: bool = False, limit: int = 500
) -> Sequence[Alert]:
    """A project's alerts, newest first (open ones only unless ``include_resolved``)."""
    query = select(Alert).where(Alert.project_id == project_id)
    if alias is not None:
        query = query.where(Alert.alias == alias)
    if not include_resolved:
        query = query.where(Alert.resolved_at.is_(None))
    return (await db.scalars(query.order_by(Alert.id.desc()).limit(limit))).all()


async def raise_alert(
    db: AsyncSession,
    project_id: str,
    alias: str,
    version: int | None,
    kind: str,
    name: str,
    *,
    message: str,
    value: float | None = None,
    baseline: float | None = None,
    threshold: float | None = None,
    baseline_version: int | None = None,
    detail: dict[str, Any] | None = None,
) -> tuple[Alert, bool]:
    """Open an alert, or refresh the open one with the same key; returns (row, newly opened).

    A new alert is logged once (``onthejob.alerts`` at WARNING), with its message.
    """
    query = select(Alert).where(
        Alert.project_id == project_id,
        Alert.alias == alias,
        Alert.version.is_(None) if version is None else Alert.version == version,
        Alert.kind == kind,
        Alert.name == name,
        Alert.resolved_at.is_(None),
    )
    row = await db.scalar(query.limit(1))
    fields: dict[str, Any] = {
        "value": value,
        "baseline": baseline,
        "threshold": threshold,
        "baseline_version": baseline_version,
        "message": message,
        "detail": dict(detail or {}),
    }
    if row is not None:
        for key, val in fields.items():
            setattr(row, key, val)
        row.last_seen_at = utcnow()
        return row, False
    row = Alert(project_id=project_id, alias=alias, version=version, kind=kind, name=name, **fields)
    db.add(row)
    where = f"{alias}@v{version}" if version is not None else alias
    log.warning("alert %s/%s on %s (project %s): %s", kind, name, where, project_id, message)
    return row, True


async def resolve_alert(db: AsyncSession, project_id: str, alert_id: int, by: str) -> Alert | None:
    """Close one alert of this project (idempotent); None when the project has no such alert."""
    row = await db.scalar(select(Alert).where(Alert.id == alert_id, Alert.project_id == project_id))
    if row is not None and row.resolved_at is None:
        row.resolved_at = utcnow()
        row.resolved_by = by
    return row


def alert_to_dict(row: Alert) -> dict[str, Any]:
    """The admin API's view of one alert."""
    return {
        "id": row.id,
        "alias": row.alias,
        "version": row.version,
        "kind": row.kind,
        "name": row.name,
        "status": "open" if row.resolved_at is None else "resolved",
        "baseline_version": row.baseline_version,
        "value": row.value,
        "baseline": row.baseline,
        "threshold": row.threshold,
        "message": row.message,
        "detail": row.detail,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "last_seen_at": row.last_seen_at.isoformat() if row.last_seen_at else None,
        "resolved_at": row.resolved_at.isoformat() if row.resolved_at else None,
        "resolved_by": row.resolved_by,
    }
