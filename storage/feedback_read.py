"""Reading feedback: an item as the API shows it, a target's history with the current winner of
each (source, name) marked, and the query behind both (storage/feedback.py writes and attaches)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.grading import newest
from storage.models import Feedback


def _winner_key(row: Feedback) -> tuple[Any, ...]:
    target = (
        ("completion", row.completion_id)
        if row.completion_id
        else ("session", row.session_id)
        if row.session_id
        else (row.target_kind, row.target_id)
    )
    return (*target, row.choice, row.source, row.name)


def current_ids(rows: Iterable[Feedback]) -> set[str]:
    """Ids of the winning revisions (:func:`storage.grading.newest`), pending ones by their stated target."""
    return {row.id for row in newest(rows, _winner_key)}


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def feedback_to_dict(row: Feedback, *, current: bool = True) -> dict[str, Any]:
    status: Literal["attached", "pending"] = "pending" if row.attached_at is None else "attached"
    return {
        "id": row.id,
        "object": "feedback",
        "target": {row.target_kind: row.target_id, **({"choice": row.choice} if row.choice is not None else {})},
        "name": row.name,
        "value": row.value,
        "comment": row.comment,
        "source": row.source,
        "idempotency_key": row.idempotency_key,
        "metadata": row.meta,
        "status": status,
        "completion_id": row.completion_id,
        "session_id": row.session_id,
        "created_at": _iso(row.created_at),
        "attached_at": _iso(row.attached_at),
        "current": current,
    }


def feedback_list(rows: Sequence[Feedback]) -> list[dict[str, Any]]:
    """History, oldest first, each marked whether it is the current winner."""
    winners = current_ids(rows)
    ordered = sorted(rows, key=lambda r: (r.created_at, r.id))
    return [feedback_to_dict(r, current=r.id in winners) for r in ordered]


def feedback_for_stmt(
    project_id: str, *, completion_id: str | None = None, session_id: str | None = None
) -> Select[Feedback]:
    """Feedback about a completion and/or a whole session (its completions' too), pending included.

    With neither, the project's newest feedback (the caller pages by time).
    """
    stmt = select(Feedback).where(Feedback.project_id == project_id)
    if completion_id is not None:
        stmt = stmt.where(
            or_(
                Feedback.completion_id == completion_id,
                and_(
                    Feedback.attached_at.is_(None),
                    Feedback.target_kind == "completion_id",
                    Feedback.target_id == completion_id,
                ),
            )
        )
    if session_id is not None:
        stmt = stmt.where(
            or_(
                Feedback.session_id == session_id,
                and_(
                    Feedback.attached_at.is_(None),
                    Feedback.target_kind == "session_id",
                    Feedback.target_id == session_id,
                ),
            )
        )
    if completion_id is None and session_id is None:
        stmt = stmt.order_by(Feedback.created_at.desc()).limit(200)
    return stmt


async def list_feedback(
    db: AsyncSession, project_id: str, *, completion_id: str | None = None, session_id: str | None = None
) -> list[dict[str, Any]]:
    rows = (await db.scalars(feedback_for_stmt(project_id, completion_id=completion_id, session_id=session_id))).all()
    return feedback_list(rows)
