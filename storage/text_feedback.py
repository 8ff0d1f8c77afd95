"""Reading what text-feedback training needs: the alias's calls, comments and corrections, hindsight, what is used.

The trainer turns these into SDPO and correction examples (``trainer.textual``), a few
sessions at a time: those the change log says changed (``trainer.textual_load.TextFeed``).
"Used" is per (trajectory, feedback item, objective) in ``used_feedback``, as for
the scalar path (objective ``reward``, :mod:`storage.used`): a comment that arrives
after its session was trained on numerically still teaches once, and only once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Select, select
from sqlalchemy.orm import Session as DbSession

from storage.changes import among
from storage.grading import Grade, current, resolve_grades
from storage.hindsight import Hindsight, next_turn_feedback
from storage.judge_config import JUDGE_SOURCE, implicit_feedback, implicit_skip
from storage.loaders import completions_stmt, feedback_listed_stmt, feedback_stmt, sessions_subquery, settings_stmt
from storage.models import Completion, Feedback, UsedFeedback
from storage.trajectories import trajectory_id
from storage.used import mark_used as mark_feedback_used

Key = tuple[str, str, str]  # (trajectory id, feedback id, objective)


@dataclass
class TextFeedback:
    """The raw material of one step's text-feedback examples."""

    calls: list[Completion] = field(default_factory=list)  # every call of the alias's sessions, in time order
    grades: list[Grade] = field(default_factory=list)  # current items with a comment, the judge's left out
    hindsight: list[Hindsight] = field(default_factory=list)  # empty unless the project turned it on
    used: set[Key] = field(default_factory=set)


def used_feedback_stmt(project_id: str, alias: str) -> Select[str, str, str]:
    return select(UsedFeedback.trajectory_id, UsedFeedback.feedback_id, UsedFeedback.objective).where(
        UsedFeedback.project_id == project_id, UsedFeedback.alias == alias
    )


def load_text_feedback(
    db: DbSession,
    project_id: str,
    alias: str,
    *,
    since: datetime | None = None,
    session_ids: Collection[str] | None = None,
) -> TextFeedback:
    """Calls, text feedback and hindsight of ``alias``'s sessions, and the keys already trained on among them.

    ``session_ids``: only those sessions (the ones that changed), read by lists that Postgres answers
    from indexes; without it, every session of the alias (since a time).
    """
    settings = db.scalar(settings_stmt(project_id)) or {}
    feedback: list[Feedback]
    if session_ids is None:
        sessions = sessions_subquery(project_id, alias=alias, since=since)
        calls = list(db.scalars(completions_stmt(project_id, sessions)))
        feedback = list(db.scalars(feedback_stmt(project_id, sessions)))
        used_stmt = used_feedback_stmt(project_id, alias)
    else:
        rows = list(
            db.scalars(
                completions_stmt(project_id, sessions_subquery(project_id, session_ids=session_ids, alias=alias))
            )
        )
        ids = sorted({c.session_id for c in rows})
        requests = [c.client_request_id for c in rows if c.client_request_id]
        feedback = list(db.scalars(feedback_listed_stmt(project_id, ids, [c.id for c in rows], requests)))
        calls = rows
        used_stmt = used_feedback_stmt(project_id, alias).where(
            among(db, UsedFeedback.trajectory_id, [trajectory_id(c.id, 0) for c in rows if c.alias == alias])
        )
    calls = [c for c in calls if c.alias == alias]
    feedback = [f for f in feedback if f.source != JUDGE_SOURCE]
    grades = [g for g in current(resolve_grades(feedback, calls)) if g.comment and g.comment.strip()]
    hindsight = next_turn_feedback(calls, implicit_skip(settings)) if implicit_feedback(settings) else []
    used = {(t, f, o) for t, f, o in db.execute(used_stmt)}
    return TextFeedback(calls, grades, hindsight, used)


__all__ = ["TextFeedback", "load_text_feedback", "mark_feedback_used", "used_feedback_stmt"]
