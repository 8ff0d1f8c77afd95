"""Lineage: what trained an adapter version, and which versions learned from a session, call or feedback item.

Read from what training records anyway: a step publishes one version
(``training_steps.adapter_version``), and ``used_feedback`` holds each (trajectory,
feedback item, objective) that step trained on; its run's config names the dataset it
trained from (``train --dataset``); ``adapters.parent_version`` says whose weights it
started from. A version learned from everything its ancestors learned from
(v5 inherits v4's weights), so the reverse question is answered transitively.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage.models import Adapter, Completion, TrainingRun, TrainingStep, UsedFeedback


def _steps(db: DbSession, project: str, alias: str, version: int) -> list[tuple[int, dict[str, Any]]]:
    """The step that published the version, with its run's config (which names a dataset it trained from)."""
    stmt = (
        select(TrainingStep.id, TrainingRun.config)
        .join(TrainingRun, TrainingRun.id == TrainingStep.run_id)
        .where(TrainingRun.project_id == project, TrainingRun.alias == alias, TrainingStep.adapter_version == version)
    )
    return [(step, config or {}) for step, config in db.execute(stmt)]


def version_lineage(db: DbSession, project: str, alias: str, version: int) -> dict[str, Any] | None:
    """What trained ``alias@v{version}``: its parent chain, and its step's trajectories and feedback items."""
    row = db.scalar(
        select(Adapter).where(
            Adapter.project_id == project, Adapter.alias == alias, Adapter.version == version, Adapter.committed()
        )
    )
    if row is None:
        return None
    steps = _steps(db, project, alias, version)
    used = db.execute(
        select(UsedFeedback.trajectory_id, UsedFeedback.feedback_id, UsedFeedback.objective)
        .where(UsedFeedback.project_id == project, UsedFeedback.step_id.in_([step for step, _ in steps]))
        .order_by(UsedFeedback.id)
    ).all()
    parents = dict(
        db.execute(
            select(Adapter.version, Adapter.parent_version).where(Adapter.project_id == project, Adapter.alias == alias)
        ).all()
    )
    chain, at = [], row.parent_version
    while at is not None and at not in chain:
        chain.append(at)
        at = parents.get(at)
    return {
        "object": "adapter.lineage",
        "alias": alias,
        "version": version,
        "parent_version": row.parent_version,
        "ancestors": chain,
        "training_run_id": row.training_run_id,
        "trajectories": sorted({t for t, _, _ in used}),
        "feedback": sorted({f for _, f, _ in used}),
        "used": [{"trajectory_id": t, "feedback_id": f, "objective": o} for t, f, o in used],
        "datasets": sorted({str(config["dataset"]) for _, config in steps if config.get("dataset")}),
    }


def dataset_versions(db: DbSession, project: str) -> dict[str, list[dict[str, Any]]]:
    """Per dataset name, the versions its runs published (``train --dataset`` names it in the run's config)."""
    runs = {
        rid: str(config["dataset"])
        for rid, config in db.execute(
            select(TrainingRun.id, TrainingRun.config).where(TrainingRun.project_id == project)
        )
        if (config or {}).get("dataset")
    }
    if not runs:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for rid, alias, version in db.execute(
        select(TrainingStep.run_id, TrainingRun.alias, TrainingStep.adapter_version)
        .join(TrainingRun, TrainingRun.id == TrainingStep.run_id)
        .where(TrainingStep.run_id.in_(runs), TrainingStep.adapter_version.is_not(None))
        .order_by(TrainingStep.run_id, TrainingStep.adapter_version)
    ):
        out.setdefault(runs[rid], []).append({"alias": alias, "version": version, "training_run_id": rid})
    return out


def learned_from(
    db: DbSession, project: str, *, calls: Iterable[str] = (), feedback: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Versions trained on a trajectory holding one of ``calls`` or on one of ``feedback``, and their descendants.

    A trajectory's id is its leaf call, and it holds every call up its parent chain: so a
    trajectory holds a given call when its leaf is that call or one of its descendants.
    """
    calls, feedback = _with_descendants(db, project, set(calls)), set(feedback)
    if not calls and not feedback:
        return []
    rows = db.execute(
        select(UsedFeedback.alias, UsedFeedback.trajectory_id, UsedFeedback.feedback_id, TrainingStep.adapter_version)
        .join(TrainingStep, TrainingStep.id == UsedFeedback.step_id)
        .where(UsedFeedback.project_id == project)
    )
    direct = {(a, v) for a, t, f, v in rows if v is not None and (t.rsplit(":", 1)[0] in calls or f in feedback)}
    children: dict[tuple[str, int], list[int]] = {}
    for alias, version, parent in db.execute(
        select(Adapter.alias, Adapter.version, Adapter.parent_version).where(Adapter.project_id == project)
    ):
        if parent is not None:
            children.setdefault((alias, parent), []).append(version)
    found, stack = set(direct), list(direct)
    while stack:
        alias, version = stack.pop()
        for child in children.get((alias, version), []):
            if (alias, child) not in found:
                found.add((alias, child))
                stack.append((alias, child))
    return [{"alias": a, "version": v, "direct": (a, v) in direct} for a, v in sorted(found)]


def _with_descendants(db: DbSession, project: str, calls: set[str]) -> set[str]:
    """These calls and every later call of their sessions that continues one of them."""
    if not calls:
        return calls
    sessions = select(Completion.session_id).where(Completion.project_id == project, Completion.id.in_(calls))
    children: dict[str, list[str]] = {}
    for cid, parent in db.execute(
        select(Completion.id, Completion.parent_id).where(
            Completion.project_id == project, Completion.session_id.in_(sessions)
        )
    ):
        if parent is not None:
            children.setdefault(parent, []).append(cid)
    found, stack = set(calls), list(calls)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def session_calls(db: DbSession, project: str, session_id: str) -> list[str]:
    return list(
        db.scalars(select(Completion.id).where(Completion.project_id == project, Completion.session_id == session_id))
    )
