"""Deleting sessions everywhere, and naming the adapter versions that learned from them.

``delete_session`` removes the session's calls, the feedback about them, their failure
flags and change-log entries, and leaves a tombstone. The recorder checks tombstones
when it writes a batch (after it has upserted, and so locked, the batch's session rows),
so copies of a call still in any worker's spool never land. The delete locks the session
row the same way first: whichever of the two commits first, the other sees it.

``delete_end_user`` does the same to every session with a call the end user made, and
leaves an end-user tombstone too: a call of theirs still in a spool, in a session the
database has never seen, is dropped at drain time (and its session tombstoned) when it
was made before the delete. Calls they make afterwards are recorded as usual.

What was trained stays recorded (``used_feedback`` names trajectory and feedback ids,
no content): that is how :func:`storage.lineage.learned_from` finds the versions a step trained from
the session, and every version trained on top of one of them (v5 inherits v4's weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import delete, or_, select
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as DbSession

from storage.db import insert_for
from storage.lineage import learned_from
from storage.models import (
    Change,
    Completion,
    CompletionFlag,
    DatasetItem,
    EndUserTombstone,
    Feedback,
    Session,
    Tombstone,
    utcnow,
)
from storage.records import CallRecord, end_user_key


def _insert(db: DbSession | AsyncSession) -> Any:
    return insert_for(db.get_bind().dialect.name)


def deleted_count(result: Any) -> int:
    """Rows a DELETE removed (a CursorResult's rowcount)."""
    return int(cast(CursorResult[Any], result).rowcount)


def delete_session(db: DbSession, project: str, session_id: str) -> dict[str, Any]:
    """Remove the session's calls, feedback, flags and change entries; leave a tombstone. The caller commits."""
    deleted, adapters = delete_sessions(db, project, [session_id])
    return {"id": session_id, "object": "session.deleted", "deleted": deleted, "adapters": adapters}


def delete_end_user(db: DbSession, project: str, end_user: str) -> dict[str, Any]:
    """Delete every session with a call ``end_user`` made; tombstone the end user for calls still spooled."""
    key, now = end_user_key(end_user), utcnow()
    db.execute(_insert(db)(EndUserTombstone).values(project_id=project, end_user=key, created_at=now)
               .on_conflict_do_update(index_elements=["project_id", "end_user"], set_={"created_at": now}))  # fmt: skip
    sessions = sorted(set(db.scalars(select(Completion.session_id).where(
        Completion.project_id == project, Completion.end_user == key))))  # fmt: skip
    deleted, adapters = delete_sessions(db, project, sessions)
    return {"id": end_user, "object": "end_user.deleted", "sessions": sessions, "deleted": deleted,
            "adapters": adapters}  # fmt: skip


def delete_sessions(db: DbSession, project: str, session_ids: Sequence[str]
                    ) -> tuple[dict[str, int], list[dict[str, Any]]]:  # fmt: skip
    """Tombstone and remove these sessions; (calls and feedback removed, versions that learned from them)."""
    now, insert = utcnow(), _insert(db)
    for session_id in session_ids:
        # Lock the session row (the recorder's upsert takes the same lock) before the tombstone.
        db.execute(insert(Session).values(project_id=project, id=session_id, created_at=now, updated_at=now)
                   .on_conflict_do_update(index_elements=["project_id", "id"], set_={"updated_at": now}))  # fmt: skip
        db.execute(insert(Tombstone).values(project_id=project, session_id=session_id, created_at=now)
                   .on_conflict_do_nothing())  # fmt: skip
    calls = list(db.scalars(select(Completion.id).where(
        Completion.project_id == project, Completion.session_id.in_(session_ids))))  # fmt: skip
    adapters = learned_from(db, project, calls=calls)
    feedback = delete_records(db, project, calls, session_ids)
    removed = deleted_count(db.execute(delete(Completion).where(Completion.project_id == project,
                                                         Completion.session_id.in_(session_ids))))  # fmt: skip
    db.execute(delete(Change).where(Change.project_id == project, Change.session_id.in_(session_ids)))
    db.execute(delete(Session).where(Session.project_id == project, Session.id.in_(session_ids)))
    # Datasets pinned copies of the sessions' feedback values: those go too (the dataset shows them as removed).
    items = deleted_count(db.execute(delete(DatasetItem).where(DatasetItem.project_id == project,
                                                               DatasetItem.session_id.in_(session_ids))))  # fmt: skip
    return {"calls": removed, "feedback": feedback, "dataset_items": items}, adapters


def delete_records(db: DbSession, project: str, calls: Sequence[str], sessions: Sequence[str]) -> int:
    """Remove the feedback about these calls and sessions, the calls' flags and change entries; feedback removed.

    The calls themselves stay for the caller to delete (it knows which rows it selected).
    """
    about = or_(Feedback.session_id.in_(sessions), Feedback.completion_id.in_(calls),
                (Feedback.target_kind == "session_id") & Feedback.target_id.in_(sessions),
                (Feedback.target_kind == "completion_id") & Feedback.target_id.in_(calls))  # fmt: skip
    gone = list(db.scalars(select(Feedback.id).where(Feedback.project_id == project, about)))
    db.execute(delete(Feedback).where(Feedback.project_id == project, Feedback.id.in_(gone)))
    db.execute(delete(CompletionFlag).where(CompletionFlag.project_id == project,
                                            CompletionFlag.completion_id.in_(calls)))  # fmt: skip
    db.execute(delete(Change).where(Change.project_id == project, Change.ref_id.in_([*calls, *gone])))
    return len(gone)


def end_users_gone(calls: Iterable[CallRecord], tombstones: Iterable[tuple[str, str, datetime]]
                   ) -> set[tuple[str, str]]:  # fmt: skip
    """(project, session) of calls a deleted end user made before their delete (``tombstones``: project, user, when)."""
    when = {(p, u): t for p, u, t in tombstones}
    return {(c.project_id, c.session_id) for c in calls if c.end_user is not None
            and (t := when.get((c.project_id, c.end_user))) is not None
            and datetime.fromisoformat(c.created_at) <= _utc(t)}  # fmt: skip


async def tombstoned_async(db: AsyncSession, calls: Sequence[CallRecord]) -> set[tuple[str, str]]:
    """(project, session) pairs of these calls that were deleted (the recorder's portable path).

    Sessions of a deleted end user found here are tombstoned in the recorder's transaction.
    """
    if not calls:
        return set()
    stmt = select(Tombstone.project_id, Tombstone.session_id).where(
        Tombstone.session_id.in_({c.session_id for c in calls})
    )
    gone = {(p, s) for p, s in (await db.execute(stmt)).all()}
    users = {c.end_user for c in calls if c.end_user is not None}
    if users:
        user = EndUserTombstone
        rows = await db.execute(select(user.project_id, user.end_user, user.created_at).where(user.end_user.in_(users)))
        new = end_users_gone(calls, [(p, u, t) for p, u, t in rows.all()]) - gone
        insert = _insert(db)
        for project_id, session_id in new:
            await db.execute(insert(Tombstone).values(project_id=project_id, session_id=session_id,
                                                      created_at=utcnow()).on_conflict_do_nothing())  # fmt: skip
        gone |= new
    return gone


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # SQLite hands times back naive
