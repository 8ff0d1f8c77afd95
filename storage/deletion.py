"""Deleting a session everywhere, and naming the adapter versions that learned from it.

``delete_session`` removes the session's calls, the feedback about them, their failure
flags and change-log entries, and leaves a tombstone. The recorder checks tombstones
when it writes a batch (after it has upserted, and so locked, the batch's session rows),
so copies of a call still in any worker's spool never land. The delete locks the session
row the same way first: whichever of the two commits first, the other sees it.

What was trained stays recorded (``used_feedback`` names trajectory and feedback ids,
no content): that is how :func:`storage.lineage.learned_from` finds the versions a step trained from
the session, and every version trained on top of one of them (v5 inherits v4's weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import delete, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as DbSession

from storage.lineage import learned_from
from storage.models import (
    Change,
    Completion,
    CompletionFlag,
    Feedback,
    Session,
    Tombstone,
    utcnow,
)


def _insert(db: DbSession) -> Any:
    return postgresql.insert if db.get_bind().dialect.name == "postgresql" else sqlite.insert


def _count(result: Any) -> int:
    """Rows a DELETE removed (a CursorResult's rowcount)."""
    return int(cast(CursorResult[Any], result).rowcount)


def delete_session(db: DbSession, project: str, session_id: str) -> dict[str, Any]:
    """Remove the session's calls, feedback, flags and change entries; leave a tombstone. The caller commits."""
    now = utcnow()
    insert = _insert(db)
    # Lock the session row (the recorder's upsert takes the same lock) before the tombstone.
    db.execute(insert(Session).values(project_id=project, id=session_id, created_at=now, updated_at=now)
               .on_conflict_do_update(index_elements=["project_id", "id"], set_={"updated_at": now}))  # fmt: skip
    db.execute(insert(Tombstone).values(project_id=project, session_id=session_id, created_at=now)
               .on_conflict_do_nothing())  # fmt: skip
    calls = list(db.scalars(select(Completion.id).where(
        Completion.project_id == project, Completion.session_id == session_id)))  # fmt: skip
    adapters = learned_from(db, project, calls=calls)
    about = or_(Feedback.session_id == session_id, Feedback.completion_id.in_(calls),
                (Feedback.target_kind == "session_id") & (Feedback.target_id == session_id),
                (Feedback.target_kind == "completion_id") & Feedback.target_id.in_(calls))  # fmt: skip
    feedback = _count(db.execute(delete(Feedback).where(Feedback.project_id == project, about)))
    db.execute(delete(CompletionFlag).where(CompletionFlag.project_id == project,
                                            CompletionFlag.session_id == session_id))  # fmt: skip
    db.execute(delete(Change).where(Change.project_id == project, Change.session_id == session_id))
    removed = _count(db.execute(delete(Completion).where(Completion.project_id == project,
                                                         Completion.session_id == session_id)))  # fmt: skip
    db.execute(delete(Session).where(Session.project_id == project, Session.id == session_id))
    return {"id": session_id, "object": "session.deleted", "deleted": {"calls": removed, "feedback": feedback},
            "adapters": adapters}  # fmt: skip


async def tombstoned_async(db: AsyncSession, calls: Sequence[Any]) -> set[tuple[str, str]]:
    """(project, session) pairs of these calls that were deleted (the recorder's portable path)."""
    if not calls:
        return set()
    stmt = select(Tombstone.project_id, Tombstone.session_id).where(
        Tombstone.session_id.in_({c.session_id for c in calls})
    )
    return {(p, s) for p, s in (await db.execute(stmt)).all()}
