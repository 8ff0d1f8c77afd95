"""Judge calibrations in the database, and the gate a project's judge grades pass or fail right now.

The judge process writes a row per calibration run; the reward rule, ``train``
output and ``GET /v1/admin/judge`` read the newest row for the project's current
judge configuration (its fingerprint: a new rubric or model starts uncalibrated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as DbSession

from storage.judge_config import JudgeSettings, Verdict, parse_judge_settings, verdict
from storage.models import JudgeCalibration, Project


@dataclass(frozen=True)
class JudgeState:
    """A project's judge as training sees it: its settings, newest calibration and the gate's verdict."""

    settings: JudgeSettings | None
    calibration: JudgeCalibration | None
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        cal = self.calibration
        return {
            "configured": self.settings is not None,
            "fingerprint": self.settings.fingerprint() if self.settings else None,
            "min_agreement": self.settings.min_agreement if self.settings else None,
            "calibration": calibration_to_dict(cal) if cal is not None else None,
            "accepted": self.verdict.accepted,
            "reason": self.verdict.reason,
            "detail": self.verdict.detail,
        }


def calibration_to_dict(row: JudgeCalibration) -> dict[str, Any]:
    return {
        "fingerprint": row.fingerprint,
        "n": row.n,
        "unreadable": row.unreadable,
        "spearman": row.spearman,
        "accuracy": row.accuracy,
        "threshold": row.threshold,
        "baseline": row.baseline,
        "created_at": row.created_at.isoformat() if row.created_at else None,
    }


def record_calibration(
    db: DbSession,
    project_id: str,
    settings: JudgeSettings,
    *,
    n: int,
    unreadable: int,
    spearman: float,
    accuracy: float,
    threshold: float,
    baseline: Mapping[str, Any] | None = None,
) -> JudgeCalibration:
    """Store one calibration run (the caller commits)."""
    row = JudgeCalibration(
        project_id=project_id,
        fingerprint=settings.fingerprint(),
        config=settings.model_dump(mode="json"),
        n=n,
        unreadable=unreadable,
        spearman=spearman,
        accuracy=accuracy,
        threshold=threshold,
        baseline=dict(baseline or {}),
    )
    db.add(row)
    db.flush()
    return row


def _latest_stmt(project_id: str, fingerprint: str) -> Select[JudgeCalibration]:
    return (
        select(JudgeCalibration)
        .where(JudgeCalibration.project_id == project_id, JudgeCalibration.fingerprint == fingerprint)
        .order_by(JudgeCalibration.created_at.desc(), JudgeCalibration.id.desc())
        .limit(1)
    )


def _state(settings: JudgeSettings | None, row: JudgeCalibration | None) -> JudgeState:
    if settings is None:
        return JudgeState(None, None, verdict(None, None, 1.0, 1))
    n, rho = (row.n, row.spearman) if row is not None else (None, None)
    return JudgeState(settings, row, verdict(n, rho, settings.min_agreement, settings.min_labelled))


def judge_state(db: DbSession, project_id: str, settings: Mapping[str, Any] | None = None) -> JudgeState:
    """The project's judge gate now (``settings``: the project's settings, read when not given)."""
    if settings is None:
        settings = db.scalar(select(Project.settings).where(Project.id == project_id)) or {}
    cfg = parse_judge_settings(settings.get("judge"))
    row = db.scalar(_latest_stmt(project_id, cfg.fingerprint())) if cfg is not None else None
    return _state(cfg, row)


async def judge_state_async(db: AsyncSession, project_id: str) -> JudgeState:
    """:func:`judge_state` for the proxy's admin routes."""
    settings = await db.scalar(select(Project.settings).where(Project.id == project_id)) or {}
    cfg = parse_judge_settings(settings.get("judge"))
    row = await db.scalar(_latest_stmt(project_id, cfg.fingerprint())) if cfg is not None else None
    return _state(cfg, row)
