"""Reading what the trainer, the export and the REST routes need: trajectories with rewards.

Statement builders, then thin sync loaders (trainer, CLI) and async ones (proxy
routes) around the same pure assembly (:mod:`storage.trajectories`) and reward
rule (:mod:`storage.grading`). Feedback still pending whose target is among the
loaded calls counts as if attached, so a grade never waits for the sweep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as DbSession

from storage.feedback_read import feedback_for_stmt, feedback_list
from storage.grading import (
    DEFAULT_RULE,
    Grade,
    RewardRule,
    apply_rewards,
    is_graded,
    resolve_grades,
)
from storage.judge_store import judge_state, judge_state_async
from storage.models import Completion, Feedback, Project, Session
from storage.trajectories import Render, Trajectory, assemble
from storage.used import screen_batch, used_keys

# --------------------------------------------------------------------------- statements


def sessions_subquery(
    project_id: str,
    *,
    session_ids: Collection[str] | None = None,
    alias: str | None = None,
    since: datetime | None = None,
) -> Select[str]:
    """Ids of the sessions to load: given ones, or those with a call of ``alias`` (since a time)."""
    stmt = select(Completion.session_id).where(Completion.project_id == project_id)
    if session_ids is not None:
        stmt = stmt.where(Completion.session_id.in_(list(session_ids)))
    if alias is not None:
        stmt = stmt.where(Completion.alias == alias)
    if since is not None:
        stmt = stmt.where(Completion.created_at >= since)
    return stmt.distinct()


def completions_stmt(project_id: str, sessions: Select[str]) -> Select[Completion]:
    """Every call of the chosen sessions, in session and time order."""
    return (
        select(Completion)
        .where(Completion.project_id == project_id, Completion.session_id.in_(sessions))
        .order_by(Completion.session_id, Completion.created_at, Completion.id)
    )


def feedback_stmt(project_id: str, sessions: Select[str]) -> Select[Feedback]:
    """Feedback about the chosen sessions or their calls, attached or still pending."""
    calls = select(Completion.id).where(Completion.project_id == project_id, Completion.session_id.in_(sessions))
    requests = select(Completion.client_request_id).where(
        Completion.project_id == project_id, Completion.session_id.in_(sessions)
    )
    pending: ColumnElement[bool] = and_(
        Feedback.attached_at.is_(None),
        or_(
            and_(Feedback.target_kind == "completion_id", Feedback.target_id.in_(calls)),
            and_(Feedback.target_kind == "session_id", Feedback.target_id.in_(sessions)),
            and_(Feedback.target_kind == "client_request_id", Feedback.target_id.in_(requests)),
        ),
    )
    return select(Feedback).where(Feedback.project_id == project_id, or_(Feedback.session_id.in_(sessions), pending))


def feedback_listed_stmt(
    project_id: str, sessions: Sequence[str], calls: Sequence[str], requests: Sequence[str]
) -> Select[Feedback]:
    """:func:`feedback_stmt` for sessions and calls already in hand (lists, not subqueries).

    Lists let Postgres answer from two indexes (the sessions' feedback, and the partial index of
    pending items) instead of filtering every feedback row of the project: an incremental reader's
    cost then follows what it reads, not the history.
    """
    pending: ColumnElement[bool] = and_(
        Feedback.attached_at.is_(None),
        or_(
            and_(Feedback.target_kind == "completion_id", Feedback.target_id.in_(list(calls))),
            and_(Feedback.target_kind == "session_id", Feedback.target_id.in_(list(sessions))),
            and_(Feedback.target_kind == "client_request_id", Feedback.target_id.in_(list(requests))),
        ),
    )
    return select(Feedback).where(
        Feedback.project_id == project_id, or_(Feedback.session_id.in_(list(sessions)), pending)
    )


def settings_stmt(project_id: str) -> Select[tuple[dict[str, Any]]]:
    return select(Project.settings).where(Project.id == project_id)


# --------------------------------------------------------------------------- pure glue


def rule_for(settings: dict[str, Any] | None) -> RewardRule:
    """A project's reward rule: ``settings["reward"]`` (see RewardRule.from_config), else the default."""
    config = (settings or {}).get("reward")
    return RewardRule.from_config(config) if config else DEFAULT_RULE


def project_rule(db: DbSession, project_id: str) -> RewardRule:
    """The project's reward rule, told whether its judge passes the agreement gate right now."""
    settings = db.scalar(settings_stmt(project_id)) or {}
    return replace(rule_for(settings), judge_accepted=judge_state(db, project_id, settings).verdict.accepted)


async def project_rule_async(db: AsyncSession, project_id: str) -> RewardRule:
    """:func:`project_rule` for the proxy's routes."""
    rule = rule_for(await db.scalar(settings_stmt(project_id)))
    return replace(rule, judge_accepted=(await judge_state_async(db, project_id)).verdict.accepted)


def build(
    completions: Sequence[Any],
    feedback: Iterable[Feedback],
    *,
    rule: RewardRule = DEFAULT_RULE,
    render: Render | None = None,
    end_of_turn: Collection[int] | None = None,
) -> list[Trajectory]:
    """Assemble and grade."""
    trajectories = assemble(completions, render=render, end_of_turn=end_of_turn)
    apply_rewards(trajectories, resolve_grades(feedback, completions), rule)
    return trajectories


# --------------------------------------------------------------------------- sync (trainer, CLI)


def load_with_calls(
    db: DbSession,
    project_id: str,
    *,
    session_ids: Collection[str] | None = None,
    alias: str | None = None,
    since: datetime | None = None,
    rule: RewardRule | None = None,
    render: Render | None = None,
    end_of_turn: Collection[int] | None = None,
) -> tuple[list[Completion], list[Trajectory]]:
    """The chosen sessions' calls (all of the project's when none is chosen) and their graded trajectories."""
    sessions = sessions_subquery(project_id, session_ids=session_ids, alias=alias, since=since)
    rule = rule or project_rule(db, project_id)
    completions = list(db.scalars(completions_stmt(project_id, sessions)))
    feedback = list(db.scalars(feedback_stmt(project_id, sessions)))
    return completions, build(completions, feedback, rule=rule, render=render, end_of_turn=end_of_turn)


def load_trajectories(db: DbSession, project_id: str, **options: Any) -> list[Trajectory]:
    """Graded trajectories; the options are those of :func:`load_with_calls`."""
    return load_with_calls(db, project_id, **options)[1]


def load_training_batch(
    db: DbSession,
    project_id: str,
    alias: str,
    *,
    since: datetime | None = None,
    rule: RewardRule | None = None,
    render: Render | None = None,
    end_of_turn: Collection[int] | None = None,
) -> tuple[list[Trajectory], Counter[str]]:
    """Every graded, untrained trajectory of ``alias``, rebuilt from its whole history; never "eval" ones.

    The trainer reads incrementally instead (:class:`storage.feed.TrainingFeed`); this is the
    one-shot form. A prefix already trained on the same feedback is masked (:mod:`storage.used`).
    The Counter holds every exclusion by reason: ``eval``, ``already_used``,
    ``missing_token_ids``/``prefix_mismatch``/``unaligned`` (capture),
    ``no_sampled_tokens``, ``infra_error`` (masked), ``ungraded``.
    """
    trajectories = load_trajectories(
        db, project_id, alias=alias, since=since, rule=rule, render=render, end_of_turn=end_of_turn
    )
    return screen_batch(trajectories, alias, used_keys(db, project_id, alias))


def _coverage(rows: Sequence[Any], feedback: Sequence[Feedback], rule: RewardRule) -> dict[int | None, dict[str, Any]]:
    last: dict[str, Any] = {}
    for row in rows:  # ordered by time: the last call's adapter owns the session
        last[row.session_id] = row
    grades: dict[str | None, list[Grade]] = {}
    for g in resolve_grades(feedback, rows):
        grades.setdefault(g.session_id, []).append(g)
    out: dict[int | None, dict[str, Any]] = {}
    for session_id, row in last.items():
        stats = out.setdefault(row.adapter_version, {"sessions": 0, "ungraded": 0})
        stats["sessions"] += 1
        stats["ungraded"] += not is_graded(grades.get(session_id, []), rule)
    for stats in out.values():
        stats["share"] = stats["ungraded"] / stats["sessions"]
    return out


def _coverage_stmts(project_id: str, alias: str | None) -> tuple[Select[Any, Any, Any, Any, Any], Select[Feedback]]:
    sessions = sessions_subquery(project_id, alias=alias)
    rows = (
        select(
            Completion.id,
            Completion.session_id,
            Completion.client_request_id,
            Completion.adapter_version,
            Completion.created_at,
        )
        .where(Completion.project_id == project_id, Completion.session_id.in_(sessions))
        .order_by(Completion.created_at, Completion.id)
    )
    return rows, feedback_stmt(project_id, sessions)


def ungraded_share(
    db: DbSession, project_id: str, *, alias: str | None = None, rule: RewardRule | None = None
) -> dict[int | None, dict[str, Any]]:
    """Per adapter version (None: base model): sessions, ungraded sessions and their share.

    A session belongs to the adapter that served its last call; it is ungraded
    when no current feedback on it or its calls gives a scalar (or masks it).
    A policy that learns to make its failures vanish shows up here first.
    """
    rows_stmt, fb_stmt = _coverage_stmts(project_id, alias)
    rule = rule or project_rule(db, project_id)
    return _coverage(list(db.execute(rows_stmt)), list(db.scalars(fb_stmt)), rule)


# --------------------------------------------------------------------------- async (proxy routes)


async def load_trajectories_async(
    db: AsyncSession,
    project_id: str,
    *,
    session_ids: Collection[str] | None = None,
    alias: str | None = None,
    rule: RewardRule | None = None,
) -> list[Trajectory]:
    """Graded trajectories of the chosen sessions (the proxy has no tokenizer: ids and inference only)."""
    sessions = sessions_subquery(project_id, session_ids=session_ids, alias=alias)
    rule = rule or await project_rule_async(db, project_id)
    completions = list(await db.scalars(completions_stmt(project_id, sessions)))
    feedback = list(await db.scalars(feedback_stmt(project_id, sessions)))
    return build(completions, feedback, rule=rule)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def completion_summary(c: Completion) -> dict[str, Any]:
    """What a session listing shows of one call (no bodies, no token ids)."""
    return {
        "id": c.id,
        "created_at": _iso(c.created_at),
        "endpoint": c.endpoint,
        "alias": c.alias,
        "served_model": c.served_model,
        "adapter_version": c.adapter_version,
        "adapter_sha256": c.adapter_sha256,
        "parent_id": c.parent_id,
        "client_request_id": c.client_request_id,
        "task_id": c.task_id,
        "tags": c.tags,
        "status_code": c.status_code,
        "termination": c.termination,
        "n": len(c.choices),
        "finish_reasons": [ch.get("finish_reason") for ch in c.choices],
        "stream": c.stream,
        "usage": c.usage,
        "latency_ms": c.latency_ms,
        "ttft_ms": c.ttft_ms,
    }


async def session_view(db: AsyncSession, project_id: str, session_id: str) -> dict[str, Any] | None:
    """A session with its calls and feedback, or None when this project has no such session."""
    row = await db.get(Session, (project_id, session_id))
    calls = list(
        await db.scalars(
            select(Completion)
            .where(Completion.project_id == project_id, Completion.session_id == session_id)
            .order_by(Completion.created_at, Completion.id)
        )
    )
    if row is None and not calls:
        return None
    feedback = list(await db.scalars(feedback_for_stmt(project_id, session_id=session_id)))
    return {
        "id": session_id,
        "object": "session",
        "task_id": row.task_id if row is not None else next((c.task_id for c in calls if c.task_id), None),
        "source": row.source if row is not None else None,
        "tags": row.tags if row is not None else [],
        "created_at": _iso(row.created_at if row is not None else calls[0].created_at),
        "updated_at": _iso(row.updated_at if row is not None else calls[-1].created_at),
        "completions": [completion_summary(c) for c in calls],
        "feedback": feedback_list(feedback),
    }
