"""What changed since a reader last looked: the change log and the readers' cursors.

Every new call and every new feedback item (a revision is a new item) appends one
entry to ``changes``, written by a trigger in the same transaction (migration 0008),
so no insert path can forget it. Readers (the trainer's loader, failure mining, the
judge) keep their own cursor and ask :func:`changes_since`.

Why not a plain sequence: a sequence value is taken when a row is inserted, not when
its transaction commits. Transaction A takes 9, B takes 10, B commits first: a reader
that sees 10 and moves its cursor there never sees 9. Each entry therefore also
records its transaction's id (Postgres ``pg_current_xact_id()``), and a reader takes
only entries whose transaction is older than the oldest one still in flight
(``pg_snapshot_xmin(pg_current_snapshot())``): every such transaction has finished,
and no later one can get an older id, so the set below that bound never grows.
Entries are ordered by ``(xid, seq)``: that pair is the position a cursor holds.
Writers never wait for each other (a counter row updated by every transaction would
serialise the recorder and the feedback routes on one lock); a long-running writing
transaction holds readers back (they wait, they never skip). On SQLite, whose
writers are serial, ``xid`` is 0 and the sequence alone orders the log.

A feedback item stored while its target had not landed carries no session; readers
resolve its target themselves (:func:`touched_sessions`), and the call's own entry
covers the moment it lands.

Deletions (:func:`log_deletion`, :func:`deletions_since`): a delete (storage/deletion.py) writes
one entry of kind ``deletion`` per session it removed (``ref_id`` and ``session_id``: the session)
and, for an end user, one more (``ref_id``: their stored key, ``session_id`` NULL), in its own
transaction. It is the one way a delete reaches what holds copies: every worker's link cache
(proxy/sessions.py follows the log across projects) and every change reader (its backlog,
storage/change_reader.py) consume it. A migration (0018) indexes these entries alone.

Pruning (:func:`prune_changes`): the readers are the rows of ``change_cursors``; an
entry every one of them has passed can go, except the newest ``keep_last`` of the
project (a safety window). A reader that has no row yet is not waited for: it starts
at the oldest entry kept, so it sees at least the window. The incremental readers
therefore write their row at their first poll; a project without any row is not
pruned (the first reader to come sees the whole log); and a reader stopped for good
holds pruning back until its row is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    String,
    Table,
    any_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session as DbSession

from storage.models import Change, ChangeCursor, Completion, Feedback, Session, utcnow

DELETION = "deletion"  # the kind of a delete's entries (log_deletion)
KEEP_LAST = 100_000  # entries of each project kept whatever the cursors say (see prune_changes)
# The oldest transaction still in flight: every entry below it is final.
PG_HORIZON: ColumnElement[int] = literal_column("pg_snapshot_xmin(pg_current_snapshot())::text::bigint")


@dataclass(frozen=True, order=True)
class Position:
    """A place in the change log: ``(xid, seq)`` of an entry; a cursor is the last position read."""

    xid: int = 0
    seq: int = 0

    def before(self) -> Position:
        """The cursor that reads this position next."""
        return Position(self.xid, self.seq - 1)


START = Position()


@dataclass(frozen=True)
class ChangeEntry:
    """One change: a call recorded (``kind`` "call"), a feedback item stored ("feedback") or a delete ("deletion")."""

    position: Position
    kind: str
    ref_id: str
    session_id: str | None


def _is_postgres(db: DbSession) -> bool:
    return db.get_bind().dialect.name == "postgresql"


def among(db: DbSession, column: Any, values: Iterable[str]) -> ColumnElement[bool]:
    """``column IN values``; on Postgres one array parameter (``= ANY``), not one parameter per value:
    rendering and parsing thousands of parameters cost more than the query itself."""
    values = list(values)
    if _is_postgres(db):
        return column == any_(bindparam(None, values, type_=ARRAY(String), expanding=False))  # type: ignore[no-any-return]
    return column.in_(values)  # type: ignore[no-any-return]


def changes_since(db: DbSession, project: str, cursor: Position, limit: int) -> list[ChangeEntry]:
    """Up to ``limit`` entries of ``project`` after ``cursor``, oldest first, never past a transaction in flight."""
    after: ColumnElement[bool] = tuple_(Change.xid, Change.seq) > tuple_(cursor.xid, cursor.seq)
    stmt = select(Change.xid, Change.seq, Change.kind, Change.ref_id, Change.session_id).where(
        Change.project_id == project, after
    )
    if _is_postgres(db):
        stmt = stmt.where(Change.xid < PG_HORIZON)
    rows = db.execute(stmt.order_by(Change.xid, Change.seq).limit(limit))
    return [ChangeEntry(Position(x, s), k, r, sid) for x, s, k, r, sid in rows]


@dataclass(frozen=True)
class Deletion:
    """A deletion entry: a session (``session_id``) or an end user (``end_user``: their stored key) deleted."""

    position: Position
    project_id: str
    session_id: str | None
    end_user: str | None


def log_deletion(db: DbSession, project: str, sessions: Iterable[str], end_user: str | None = None) -> None:
    """Write the deletion entries of one delete, in the caller's transaction (it commits)."""
    rows: list[dict[str, Any]] = [
        {"project_id": project, "kind": DELETION, "ref_id": s, "session_id": s} for s in sessions
    ]
    if end_user is not None:
        rows.append({"project_id": project, "kind": DELETION, "ref_id": end_user, "session_id": None})
    if not rows:
        return
    xid: Any = literal_column("pg_current_xact_id()::text::bigint") if _is_postgres(db) else 0
    db.execute(insert(cast(Table, Change.__table__)).values(xid=xid), rows)


def deletions_since(
    db: DbSession, cursor: Position, limit: int = 1000, project: str | None = None, *, final: bool = True
) -> list[Deletion]:
    """Deletion entries after ``cursor`` (of every project, or of ``project``), oldest first; ``final``: none
    that a transaction still in flight could precede (as :func:`changes_since`), else every one committed."""
    after: ColumnElement[bool] = tuple_(Change.xid, Change.seq) > tuple_(cursor.xid, cursor.seq)
    stmt = select(Change.xid, Change.seq, Change.project_id, Change.ref_id, Change.session_id).where(
        Change.kind == DELETION, after
    )
    if project is not None:
        stmt = stmt.where(Change.project_id == project)
    if final and _is_postgres(db):
        stmt = stmt.where(Change.xid < PG_HORIZON)
    rows = db.execute(stmt.order_by(Change.xid, Change.seq).limit(limit))
    return [Deletion(Position(x, s), p, sid, None if sid is not None else ref) for x, s, p, ref, sid in rows]


def deleted_after(db: DbSession, project: str, sessions: Iterable[str], cursor: Position) -> set[str]:
    """Of these sessions, those with a deletion entry after ``cursor``, committed or not yet final (a reader
    that holds items of them re-reads them before handing any out)."""
    after: ColumnElement[bool] = tuple_(Change.xid, Change.seq) > tuple_(cursor.xid, cursor.seq)
    stmt = select(Change.session_id).where(
        Change.kind == DELETION, Change.project_id == project, after, among(db, Change.ref_id, sessions)
    )
    return {s for s in db.scalars(stmt.distinct()) if s is not None}


def horizon(db: DbSession) -> int | None:
    """The oldest transaction still in flight (Postgres): entries of older ones are final. None: all are (SQLite)."""
    return int(db.scalar(select(PG_HORIZON)) or 0) if _is_postgres(db) else None


def latest_deletion(db: DbSession) -> Position:
    """The newest final deletion entry's position (a follower starting there sees only later deletes)."""
    stmt = select(Change.xid, Change.seq).where(Change.kind == DELETION)
    if _is_postgres(db):
        stmt = stmt.where(Change.xid < PG_HORIZON)
    row = db.execute(stmt.order_by(Change.xid.desc(), Change.seq.desc()).limit(1)).first()
    return Position(row[0], row[1]) if row is not None else START


def latest_position(db: DbSession, project: str) -> Position:
    """The newest final position of ``project`` (a reader starting there sees only what comes next)."""
    stmt = select(Change.xid, Change.seq).where(Change.project_id == project)
    if _is_postgres(db):
        stmt = stmt.where(Change.xid < PG_HORIZON)
    row = db.execute(stmt.order_by(Change.xid.desc(), Change.seq.desc()).limit(1)).first()
    return Position(row[0], row[1]) if row is not None else START


def await_horizon(db: DbSession, project: str, timeout_s: float = 2.0) -> bool:
    """Wait, briefly, until every entry of ``project`` committed by now is final; False if it is not yet.

    Committed entries sit above the horizon while an older transaction (of any database in
    the cluster) is still open: usually for milliseconds. A one-shot reader (``train`` without
    ``--watch``) waits for them rather than finding nothing; a watching one would only see them next poll.
    """
    if not _is_postgres(db):
        return True
    newest = db.scalar(select(func.max(Change.xid)).where(Change.project_id == project))
    deadline = time.monotonic() + timeout_s
    while newest is not None and (db.scalar(select(PG_HORIZON)) or 0) <= newest:
        if time.monotonic() >= deadline:
            return False
        db.rollback()  # a fresh snapshot
        time.sleep(0.01)
    return True


def touched_sessions(db: DbSession, project: str, changes: Sequence[ChangeEntry]) -> dict[str, Position]:
    """The sessions these changes touch, each with the position of its newest change.

    A feedback entry without a session (stored pending) is resolved by its target, if that has landed.
    A deletion entry touches its session too: read again, a deleted session has nothing left (a call
    made after the delete starts it afresh, and is what is read).
    """
    out: dict[str, Position] = {}

    def touch(session_id: str, at: Position) -> None:
        out[session_id] = max(at, out.get(session_id, START))

    pending: dict[str, Position] = {}
    for change in changes:
        if change.session_id is not None:
            touch(change.session_id, change.position)
        elif change.kind == "feedback":
            pending[change.ref_id] = change.position
    if pending:
        for fid, session_id in _resolve_pending(db, project, pending):
            if session_id is not None:
                touch(session_id, pending[fid])
    return out


def _resolve_pending(db: DbSession, project: str, ids: Iterable[str]) -> list[tuple[str, str | None]]:
    """(feedback id, session id) of items stored pending, by their session, or their target if it landed since."""
    items = list(
        db.execute(
            select(Feedback.id, Feedback.session_id, Feedback.target_kind, Feedback.target_id).where(
                Feedback.project_id == project, Feedback.id.in_(list(ids))
            )
        )
    )
    by_call = {t for _, s, k, t in items if s is None and k in ("completion_id", "client_request_id")}
    found: dict[tuple[str, str], str] = {}
    if by_call:
        rows = db.execute(
            select(Completion.id, Completion.client_request_id, Completion.session_id).where(
                Completion.project_id == project,
                or_(Completion.id.in_(by_call), Completion.client_request_id.in_(by_call)),
            )
        )
        for cid, crid, sid in rows:
            found[("completion_id", cid)] = sid
            if crid:
                found[("client_request_id", crid)] = sid
    named = {t for _, s, k, t in items if s is None and k == "session_id"}
    if named:
        known = db.scalars(select(Session.id).where(Session.project_id == project, Session.id.in_(named)))
        found.update({("session_id", sid): sid for sid in known})
    return [(fid, sid if sid is not None else found.get((kind, target))) for fid, sid, kind, target in items]


# --------------------------------------------------------------------------- cursors


def load_cursor(db: DbSession, project: str, consumer: str) -> Position | None:
    """The settled position ``consumer`` saved, or None when it never saved one."""
    row = db.get(ChangeCursor, (project, consumer))
    return Position(row.xid, row.seq) if row is not None else None


def save_cursor(db: DbSession, project: str, consumer: str, position: Position) -> None:
    """Remember ``consumer``'s settled position (the caller commits, with whatever made it settled)."""
    row = db.get(ChangeCursor, (project, consumer))
    if row is None:
        db.add(ChangeCursor(project_id=project, consumer=consumer, xid=position.xid, seq=position.seq))
    elif (row.xid, row.seq) != (position.xid, position.seq):
        row.xid, row.seq, row.updated_at = position.xid, position.seq, utcnow()


# --------------------------------------------------------------------------- pruning


def prune_changes(db: DbSession, project: str, *, keep_last: int = KEEP_LAST, batch: int = 2000) -> int:
    """Delete ``project``'s entries every cursor has passed, but for the newest ``keep_last``; how many.

    Commits per batch of ``batch`` entries (a long backlog never holds one huge transaction).
    """
    cursors = db.execute(select(ChangeCursor.xid, ChangeCursor.seq).where(ChangeCursor.project_id == project)).all()
    if not cursors:
        return 0  # no reader has read anything yet
    bound = min(Position(x, s) for x, s in cursors)
    if keep_last > 0:
        newest = db.execute(
            select(Change.xid, Change.seq)
            .where(Change.project_id == project)
            .order_by(Change.xid.desc(), Change.seq.desc())
            .offset(keep_last - 1)
            .limit(1)
        ).first()
        if newest is None:
            return 0  # the whole log is within the window
        bound = min(bound, Position(newest[0], newest[1]).before())
    passed = select(Change.seq).where(
        Change.project_id == project, tuple_(Change.xid, Change.seq) <= tuple_(bound.xid, bound.seq)
    )
    done = 0
    while seqs := list(db.scalars(passed.order_by(Change.xid, Change.seq).limit(batch))):
        db.execute(delete(Change).where(Change.seq.in_(seqs)))
        db.commit()
        done += len(seqs)
    return done


def prune_all(db: DbSession, *, keep_last: int = KEEP_LAST) -> dict[str, int]:
    """:func:`prune_changes` for every project with a reader; entries deleted per project."""
    projects = db.scalars(select(ChangeCursor.project_id).distinct()).all()
    return {project: prune_changes(db, project, keep_last=keep_last) for project in projects}
