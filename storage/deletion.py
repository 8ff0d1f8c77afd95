"""Deleting sessions everywhere, and naming the adapter versions that learned from them.

``delete_session`` removes the session's calls, the feedback about them, their failure
flags and change-log entries, leaves a tombstone holding the time of the delete by the
database's clock, and writes a deletion entry to the change log (storage/changes.py:
every worker's link cache and every change reader consume it; docs/architecture.md,
"Deleting"). The recorder checks tombstones when it writes a batch (after it has
upserted, and so locked, the batch's session rows): a call made before the delete, a
copy still in any worker's spool, never lands; a call made after it (harnesses reuse
ids such as ``customer-42``) starts the session afresh. The delete locks the session
row the same way first, and reads the clock only then: whichever of the two commits
first, the other sees it.

A call's time is the proxy's (``created_at``, when it arrived); the recorder compares it
with the tombstone's after adding the database clock's lead over its own, measured in
the same round trip (:class:`Deleted`), so a skewed proxy clock neither drops a later
call nor lands an earlier one.

``delete_end_user`` does the same to every session with a call the end user made, and
leaves an end-user tombstone too: a call of theirs still in a spool, in a session the
database has never seen, is dropped at drain time (and its session tombstoned with the
end user's time) when it was made before the delete. Calls they make afterwards are
recorded as usual.

Before each step the trainer drops what it holds of a deleted session but calls made after
the delete (:func:`live`): what a delete removed after the trainer read it is never trained on.

What was trained stays recorded (``used_feedback`` names trajectory and feedback ids,
no content): that is how :func:`storage.lineage.learned_from` finds the versions a step trained from
the session, and every version trained on top of one of them (v5 inherits v4's weights).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import delete, func, or_, select
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as DbSession

from storage.changes import START, among, deleted_after, log_deletion
from storage.db import insert_for
from storage.lineage import learned_from
from storage.models import (
    Change,
    Completion,
    CompletionFlag,
    DatasetItem,
    EndUserTombstone,
    Feedback,
    LinkEntry,
    Session,
    Tombstone,
    utcnow,
)
from storage.records import CallRecord, end_user_key
from storage.stored_read import release_prefixes


def _insert(db: DbSession | AsyncSession) -> Any:
    return insert_for(db.get_bind().dialect.name)


def deleted_count(result: Any) -> int:
    """Rows a DELETE removed (a CursorResult's rowcount)."""
    return int(cast(CursorResult[Any], result).rowcount)


T = TypeVar("T")


def delete_session(db: DbSession, project: str, session_id: str) -> dict[str, Any]:
    """Remove the session's calls, feedback, flags and change entries; leave a tombstone. The caller commits."""
    deleted, adapters = delete_sessions(db, project, [session_id])
    return {"id": session_id, "object": "session.deleted", "deleted": deleted, "adapters": adapters}


def delete_end_user(db: DbSession, project: str, end_user: str) -> dict[str, Any]:
    """Delete every session with a call ``end_user`` made; tombstone the end user for calls still spooled."""
    key, at = end_user_key(end_user), db_clock(db)
    stmt = _insert(db)(EndUserTombstone).values(project_id=project, end_user=key, created_at=at)
    db.execute(
        stmt.on_conflict_do_update(
            index_elements=["project_id", "end_user"], set_={"created_at": stmt.excluded.created_at}
        )
    )
    their_sessions = select(Completion.session_id).where(Completion.project_id == project, Completion.end_user == key)
    # Calls another host answered whose rows have not landed yet: their link entries (proxy/link_feed.py) go too.
    db.execute(delete(LinkEntry).where(LinkEntry.project_id == project, LinkEntry.end_user == key))
    sessions = sorted(set(db.scalars(their_sessions)))
    deleted, adapters = delete_sessions(db, project, sessions, end_user=key)
    return {
        "id": end_user,
        "object": "end_user.deleted",
        "sessions": sessions,
        "deleted": deleted,
        "adapters": adapters,
    }


def delete_sessions(
    db: DbSession, project: str, session_ids: Sequence[str], end_user: str | None = None
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Tombstone and remove these sessions, log the delete (and ``end_user``'s, their stored key);
    (calls and feedback removed, versions that learned from them)."""
    now, insert = utcnow(), _insert(db)
    for session_id in session_ids:
        # Lock the session row (the recorder's upsert takes the same lock) before the tombstone.
        db.execute(
            insert(Session)
            .values(project_id=project, id=session_id, created_at=now, updated_at=now)
            .on_conflict_do_update(index_elements=["project_id", "id"], set_={"updated_at": now})
        )
    if session_ids:
        # The time read after the locks: a call the recorder landed first was made before it.
        at = db_clock(db)
        stmt = insert(Tombstone).values(
            [{"project_id": project, "session_id": s, "created_at": at} for s in session_ids]
        )
        db.execute(
            stmt.on_conflict_do_update(
                index_elements=["project_id", "session_id"], set_={"created_at": stmt.excluded.created_at}
            )
        )
    their_calls = select(Completion.id).where(Completion.project_id == project, Completion.session_id.in_(session_ids))
    # FOR UPDATE: a recorder inserting a delta of one of these holds it FOR KEY SHARE and, once this commits,
    # finds it gone and stores its row in full (storage/stored_form.py, Encoder.settle). Linking keeps a parent
    # in its child's session, so the sessions' own calls are every parent these deletes take.
    calls = list(db.scalars(their_calls.with_for_update()))
    adapters = learned_from(db, project, calls=calls)
    feedback = delete_records(db, project, calls, session_ids)
    release_prefixes(db, project, calls)  # the shared prefixes they reference (storage/stored_form.py)
    drop_calls = delete(Completion).where(Completion.project_id == project, Completion.session_id.in_(session_ids))
    removed = deleted_count(db.execute(drop_calls))
    db.execute(delete(Change).where(Change.project_id == project, Change.session_id.in_(session_ids)))
    db.execute(delete(Session).where(Session.project_id == project, Session.id.in_(session_ids)))
    db.execute(delete(LinkEntry).where(LinkEntry.project_id == project, LinkEntry.session_id.in_(session_ids)))
    # Datasets pinned copies of the sessions' feedback values: those go too (the dataset shows them as removed).
    pinned = delete(DatasetItem).where(DatasetItem.project_id == project, DatasetItem.session_id.in_(session_ids))
    items = deleted_count(db.execute(pinned))
    log_deletion(db, project, session_ids, end_user)  # after the sessions' own entries went
    return {"calls": removed, "feedback": feedback, "dataset_items": items}, adapters


def db_clock(db: DbSession) -> datetime:
    """The database's time now (Postgres ``clock_timestamp()``, not its transaction's start; SQLite: ours)."""
    if db.get_bind().dialect.name == "postgresql":
        return _utc(cast(datetime, db.scalar(select(func.clock_timestamp()))))
    return utcnow()


def delete_records(db: DbSession, project: str, calls: Sequence[str], sessions: Sequence[str]) -> int:
    """Remove the feedback about these calls and sessions, the calls' flags and change entries; feedback removed.

    The calls themselves stay for the caller to delete (it knows which rows it selected).
    """
    about = or_(
        Feedback.session_id.in_(sessions),
        Feedback.completion_id.in_(calls),
        (Feedback.target_kind == "session_id") & Feedback.target_id.in_(sessions),
        (Feedback.target_kind == "completion_id") & Feedback.target_id.in_(calls),
    )
    gone = list(db.scalars(select(Feedback.id).where(Feedback.project_id == project, about)))
    db.execute(delete(Feedback).where(Feedback.project_id == project, Feedback.id.in_(gone)))
    db.execute(
        delete(CompletionFlag).where(CompletionFlag.project_id == project, CompletionFlag.completion_id.in_(calls))
    )
    db.execute(delete(Change).where(Change.project_id == project, Change.ref_id.in_([*calls, *gone])))
    return len(gone)


@dataclass
class Deleted:
    """What of a recorder's batch must not land: (project, session) → the time of its delete by the database's
    clock, and how far that clock is ahead of ours (``offset``, measured by the recorder's query)."""

    times: dict[tuple[str, str], datetime] = field(default_factory=dict)
    offset: timedelta = timedelta(0)

    def __bool__(self) -> bool:
        return bool(self.times)

    def drops(self, call: CallRecord) -> bool:
        """Whether ``call`` was made before its session (or end user) was deleted."""
        at = self.times.get((call.project_id, call.session_id))
        return at is not None and before(call, at, self.offset)

    def merge(self, more: dict[tuple[str, str], datetime]) -> None:
        for key, at in more.items():
            self.times[key] = max(at, self.times.get(key, at))


def before(call: CallRecord, at: datetime, offset: timedelta) -> bool:
    """Whether ``call`` (stamped by our clock) was made no later than ``at`` (the database's; ``offset`` its lead)."""
    return datetime.fromisoformat(call.created_at) + offset <= _utc(at)


def clock_offset(db_now: datetime, sent: datetime, answered: datetime) -> timedelta:
    """The database clock's lead over ours, from its time read between ``sent`` and ``answered`` (our clock)."""
    return _utc(db_now) - (sent + (answered - sent) / 2)


def end_users_gone(
    calls: Iterable[CallRecord], tombstones: Iterable[tuple[str, str, datetime]], offset: timedelta = timedelta(0)
) -> dict[tuple[str, str], datetime]:
    """(project, session) → the delete's time, of calls a deleted end user made before their delete
    (``tombstones``: project, user, when, by the database's clock; ``offset``: its lead over ours)."""
    when = {(p, u): _utc(t) for p, u, t in tombstones}
    out: dict[tuple[str, str], datetime] = {}
    for c in calls:
        at = when.get((c.project_id, c.end_user)) if c.end_user is not None else None
        if at is not None and before(c, at, offset):
            out[(c.project_id, c.session_id)] = max(at, out.get((c.project_id, c.session_id), at))
    return out


async def tombstoned_async(db: AsyncSession, calls: Sequence[CallRecord]) -> Deleted:
    """What of these calls must not land (the recorder's portable path).

    Sessions of a deleted end user found here are tombstoned, with the end user's time, in the recorder's transaction.
    """
    if not calls:
        return Deleted()
    sent = datetime.now(UTC)
    postgres = db.get_bind().dialect.name == "postgresql"
    db_now = (await db.scalar(select(func.clock_timestamp()))) if postgres else None
    offset = clock_offset(db_now, sent, datetime.now(UTC)) if db_now is not None else timedelta(0)
    stmt = select(Tombstone.project_id, Tombstone.session_id, Tombstone.created_at).where(
        Tombstone.session_id.in_({c.session_id for c in calls})
    )
    out = Deleted({(p, s): _utc(t) for p, s, t in (await db.execute(stmt)).all()}, offset)
    users = {c.end_user for c in calls if c.end_user is not None}
    if users:
        user = EndUserTombstone
        rows = await db.execute(select(user.project_id, user.end_user, user.created_at).where(user.end_user.in_(users)))
        new = end_users_gone(calls, [(p, u, t) for p, u, t in rows.all()], offset)
        insert = _insert(db)
        for (project_id, session_id), at in new.items():
            stmt = insert(Tombstone).values(project_id=project_id, session_id=session_id, created_at=at)
            await db.execute(
                stmt.on_conflict_do_update(
                    index_elements=["project_id", "session_id"],
                    set_={"created_at": stmt.excluded.created_at},
                    where=Tombstone.created_at < stmt.excluded.created_at,
                )
            )
        out.merge(new)
    return out


def live(
    db: DbSession, project: str, items: Sequence[T], session: Callable[[T], str], calls: Callable[[T], Iterable[str]]
) -> tuple[list[T], int]:
    """The items not of a deleted session, and how many were; the trainer's last look before a step.

    An item of a session with a deletion entry (:func:`storage.changes.deleted_after`) stays only if its calls
    (``calls(item)``: completion ids) are all still recorded: it was read from calls made after the delete.
    """
    deleted = deleted_after(db, project, {session(item) for item in items}, START)
    if not deleted:
        return list(items), 0
    wanted = {c for item in items if session(item) in deleted for c in calls(item)}
    still_recorded = select(Completion.id).where(Completion.project_id == project, among(db, Completion.id, wanted))
    found = set(db.scalars(still_recorded))
    kept = [item for item in items if session(item) not in deleted or all(c in found for c in calls(item))]
    return kept, len(items) - len(kept)


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # SQLite hands times back naive
