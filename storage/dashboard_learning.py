"""What the dashboard's learning view reads: reward over time per alias and version, deployments, training.

The reward curve is each feedback item's scalar under the project's reward rule
(:meth:`storage.grading.RewardRule.score`), put on the version that served the call
it names (a session-wide item: the version of that session's last call), averaged in
time buckets over the project's whole history (each bucket from its newest items).
It is what the traffic earned, not the trainer's view of it: the trainer's
``reward_mean`` per step is beside it in the run view.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, true, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from storage.grading import RewardRule
from storage.models import Completion, Deployment, Feedback, TrainingRun, TrainingStep

BUCKETS = 40
PER_BUCKET = 50  # the newest items of each time bucket the curve is drawn from


def _series_key(alias: str, version: int | None) -> str:
    return f"{alias}@v{version}" if version is not None else f"{alias}@base"


async def _sample(db: AsyncSession, project_id: str) -> list[Any]:
    """Up to PER_BUCKET of the newest feedback items in each of BUCKETS equal spans of the project's history.

    Bounded work at any history length (one small index range per bucket, then those items' calls by
    key), and the whole history on the time axis, where the newest N items would show the last hours.
    """
    graded = (Feedback.project_id == project_id, Feedback.session_id.is_not(None))
    lo, hi = (
        await db.execute(select(func.min(Feedback.created_at), func.max(Feedback.created_at)).where(*graded))
    ).one()
    if lo is None or hi is None:
        return []
    width = max((hi - lo) / BUCKETS, timedelta(seconds=1))
    parts = []
    for b in range(BUCKETS):
        start = lo + b * width
        span = (Feedback.created_at >= start, Feedback.created_at < start + width if b < BUCKETS - 1 else true())
        newest = select(Feedback).where(*graded, *span).order_by(Feedback.created_at.desc()).limit(PER_BUCKET)
        sub = newest.subquery()
        parts.append(
            select(
                sub.c.name,
                sub.c.value,
                sub.c.comment,
                sub.c.created_at,
                Completion.alias,
                Completion.adapter_version,
                sub.c.session_id,
                sub.c.completion_id,
            ).outerjoin(Completion, Completion.id == sub.c.completion_id)
        )
    return list((await db.execute(union_all(*parts))).all())  # one round trip


async def reward_series(db: AsyncSession, project_id: str, rule: RewardRule, alias: str | None) -> dict[str, Any]:
    """Mean scalar per time bucket, per ``alias@vN`` (``alias@base``), from a sample of each bucket's feedback."""
    rows = await _sample(db, project_id)
    session_only = {r.session_id for r in rows if r.completion_id is None}
    last_call: dict[str, tuple[str, int | None]] = {}
    if session_only:
        calls = (
            select(Completion.session_id, Completion.alias, Completion.adapter_version)
            .where(Completion.project_id == project_id, Completion.session_id.in_(list(session_only)))
            .order_by(Completion.created_at)
        )
        for sid, a, v in (await db.execute(calls)).all():
            last_call[sid] = (a, v)
    points: list[tuple[float, str, float]] = []
    for r in rows:
        score = rule.score(r.name, r.value, r.comment)
        if not isinstance(score, float):
            continue
        served = (r.alias, r.adapter_version) if r.completion_id else last_call.get(r.session_id)
        if served is None or served[0] is None or (alias and served[0] != alias):
            continue
        points.append((r.created_at.timestamp(), _series_key(*served), score))
    return {"series": _bucketed(points), "points": len(points), "per_bucket": PER_BUCKET}


def _bucketed(points: list[tuple[float, str, float]]) -> list[dict[str, Any]]:
    if not points:
        return []
    start = min(p[0] for p in points)
    end = max(p[0] for p in points)
    width = max((end - start) / BUCKETS, 1.0)
    sums: dict[str, dict[int, list[float]]] = {}
    for when, key, score in points:
        bucket = min(int((when - start) / width), BUCKETS - 1)
        acc = sums.setdefault(key, {}).setdefault(bucket, [0.0, 0.0])
        acc[0] += score
        acc[1] += 1
    out = []
    for key in sorted(sums):
        pts = [{"t": start + (b + 0.5) * width, "mean": s / n, "n": int(n)} for b, (s, n) in sorted(sums[key].items())]
        out.append({"key": key, "points": pts})
    return out


async def deployment_events(db: AsyncSession, project_id: str, alias: str | None) -> list[dict[str, Any]]:
    """Every deployment (and rollback: a version below the previous one, or back to base), oldest first."""
    stmt = select(Deployment).where(Deployment.project_id == project_id)
    if alias:
        stmt = stmt.where(Deployment.alias == alias)
    rows = (await db.scalars(stmt.order_by(Deployment.created_at).limit(1000))).all()
    out = []
    for d in rows:
        back = d.previous_version is not None and (d.version is None or d.version < d.previous_version)
        kind = "failed" if d.status == "failed" else ("rollback" if back else "deploy")
        out.append(
            {
                "id": d.id,
                "t": d.created_at.timestamp(),
                "created_at": d.created_at.isoformat(),
                "alias": d.alias,
                "version": d.version,
                "previous_version": d.previous_version,
                "status": d.status,
                "kind": kind,
            }
        )
    return out


async def training_runs(db: AsyncSession, project_id: str, alias: str | None) -> list[dict[str, Any]]:
    """Training runs, newest first, each with its step count and newest step's metrics."""
    stmt = select(TrainingRun).where(TrainingRun.project_id == project_id)
    if alias:
        stmt = stmt.where(TrainingRun.alias == alias)
    runs = (await db.scalars(stmt.order_by(TrainingRun.id.desc()).limit(200))).all()
    ids = [r.id for r in runs]
    counts: dict[int, tuple[int, int]] = {}
    if ids:
        agg = (
            select(TrainingStep.run_id, func.count(), func.max(TrainingStep.id))
            .where(TrainingStep.run_id.in_(ids))
            .group_by(TrainingStep.run_id)
        )
        counts = {run: (n, last) for run, n, last in (await db.execute(agg)).all()}
    last_ids = [last for _, last in counts.values()]
    newest = {}
    if last_ids:
        newest = {s.run_id: s for s in (await db.scalars(select(TrainingStep).where(TrainingStep.id.in_(last_ids))))}
    out = []
    for r in runs:
        step = newest.get(r.id)
        out.append(
            {
                "id": r.id,
                "alias": r.alias,
                "objective": r.objective,
                "base_model": r.base_model,
                "status": r.status,
                "started_at": r.started_at.isoformat(),
                "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                "steps": counts.get(r.id, (0, 0))[0],
                "last_metrics": step.metrics if step else None,
                "last_version": step.adapter_version if step else None,
            }
        )
    return out


async def run_steps(db: AsyncSession, project_id: str, run_id: int) -> dict[str, Any] | None:
    """One run of this project with every step's metrics, or None."""
    run = await db.scalar(select(TrainingRun).where(TrainingRun.id == run_id, TrainingRun.project_id == project_id))
    if run is None:
        return None
    steps = (
        await db.scalars(select(TrainingStep).where(TrainingStep.run_id == run_id).order_by(TrainingStep.step))
    ).all()
    return {
        "id": run.id,
        "alias": run.alias,
        "objective": run.objective,
        "status": run.status,
        "config": run.config,
        "steps": [
            {
                "step": s.step,
                "adapter_version": s.adapter_version,
                "created_at": s.created_at.isoformat(),
                "metrics": s.metrics,
            }
            for s in steps
        ],
    }
