"""Feedback: store (idempotent, revisions kept), attach late, count orphans, read.

Validation of what the API takes is in :mod:`storage.feedback_input`.

Feedback is a fact about a completion or a session from a source at a time. Its
target is resolved only inside the caller's project: a target that exists in
another project looks exactly like an unknown one (stored pending). Pending
items attach when the call lands (:func:`attach_pending`, called by the
recorder in the transaction that inserts completions) or on a sweep
(:func:`sweep_pending`, which also closes the race of feedback and its call
committing at the same moment); those still pending after a TTL are orphans.

The sweep walks the pending items of the last TTL by cursor, ``(created_at, id)``,
a page at a time, and resolves a page's targets in three queries. An item older than
the TTL is aged out: no sweep looks at it again (it still attaches if its call lands
through the recorder, which asks by target), and :func:`count_orphans` counts it
(the proxy's ``onthejob_feedback_orphans``). So items that can never attach neither
starve newer ones (a sweep that took the oldest 500 each time did) nor cost a pass
for longer than the TTL.
Revisions are new rows: the newest from the same (source, name) wins, every
row stays readable.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as DbSession

from storage.feedback_input import FeedbackConflict, FeedbackIn
from storage.grading import LandedCall, Targets
from storage.models import Completion, Feedback, Project, Session, utcnow

ORPHAN_TTL = timedelta(hours=1)


# --------------------------------------------------------------------------- storing


def new_feedback_id() -> str:
    """Time-ordered, so equal timestamps still order revisions by arrival."""
    return f"fb-{time.time_ns():016x}{secrets.token_hex(6)}"


async def resolve_target(db: AsyncSession, project_id: str, kind: str, target_id: str) -> tuple[str | None, str | None]:
    """(completion_id, session_id) of a target in this project; (None, None) when unknown here.

    The database finds the candidates; :class:`storage.grading.Targets` applies the rule.
    """
    if kind == "session_id":
        known = await db.scalar(select(Session.id).where(Session.project_id == project_id, Session.id == target_id))
        if known is None:
            known = await db.scalar(
                select(Completion.session_id)
                .where(Completion.project_id == project_id, Completion.session_id == target_id)
                .limit(1)
            )
        return Targets((), [known] if known is not None else []).resolve(kind, target_id)
    column = Completion.id if kind == "completion_id" else Completion.client_request_id
    stmt = select(Completion.id, Completion.session_id, Completion.client_request_id, Completion.created_at)
    rows = (await db.execute(stmt.where(Completion.project_id == project_id, column == target_id))).all()
    return Targets(rows).resolve(kind, target_id)


def _same(row: Feedback, item: FeedbackIn) -> bool:
    same_value = isinstance(row.value, bool) == isinstance(item.value, bool) and row.value == item.value
    return same_value and (row.target_kind, row.target_id, row.choice, row.name, row.comment, row.source, row.meta) == (
        item.target.kind,
        item.target.id,
        item.target.choice,
        item.name,
        item.comment,
        item.source,
        item.metadata,
    )


async def _by_key(db: AsyncSession, project_id: str, key: str) -> Feedback | None:
    stmt = select(Feedback).where(Feedback.project_id == project_id, Feedback.idempotency_key == key)
    return (await db.scalars(stmt)).first()


async def _replay(db: AsyncSession, row: Feedback, item: FeedbackIn) -> Feedback:
    if not _same(row, item):
        raise FeedbackConflict(
            f"id {item.id!r} was already used for different feedback; a revision needs a new id "
            "(the newest from the same source and name wins)",
            "id",
        )
    if row.attached_at is None:
        await _try_attach(db, row)
    return row


async def _try_attach(db: AsyncSession, row: Feedback) -> bool:
    completion_id, session_id = await resolve_target(db, row.project_id, row.target_kind, row.target_id)
    if session_id is None:
        return False
    row.completion_id, row.session_id, row.attached_at = completion_id, session_id, utcnow()
    return True


async def _ensure_project(db: AsyncSession, project_id: str) -> None:
    """Feedback may come before the recorder has created the project row (it does so lazily)."""
    if await db.get(Project, project_id) is not None:
        return
    try:
        async with db.begin_nested():
            db.add(Project(id=project_id, settings={}))
    except IntegrityError:
        pass  # created meanwhile by the recorder or another replica


async def submit_feedback(db: AsyncSession, project_id: str, items: Sequence[FeedbackIn]) -> list[Feedback]:
    """Store validated items (attached or pending); a retried ``id`` returns the stored row.

    Does not commit: the caller does, so a refused batch stores nothing.
    """
    out: list[Feedback] = []
    await _ensure_project(db, project_id)
    for item in items:
        if item.id is not None and (existing := await _by_key(db, project_id, item.id)) is not None:
            out.append(await _replay(db, existing, item))
            continue
        completion_id, session_id = await resolve_target(db, project_id, item.target.kind, item.target.id)
        fid = new_feedback_id()
        now = utcnow()
        row = Feedback(
            id=fid,
            project_id=project_id,
            idempotency_key=item.id or fid,
            target_kind=item.target.kind,
            target_id=item.target.id,
            choice=item.target.choice,
            completion_id=completion_id,
            session_id=session_id,
            name=item.name,
            value=item.value,
            comment=item.comment,
            source=item.source,
            meta=item.metadata,
            created_at=now,
            attached_at=now if session_id is not None else None,
        )
        try:
            async with db.begin_nested():
                db.add(row)
        except IntegrityError:
            # Another replica stored the same idempotency key first.
            existing = await _by_key(db, project_id, item.id or fid)
            if existing is None:
                raise
            out.append(await _replay(db, existing, item))
            continue
        out.append(row)
    return out


async def attach_pending(db: AsyncSession, completions: Sequence[LandedCall]) -> int:
    """Attach pending feedback naming these just-recorded completions; returns how many.

    Matches by completion id, client request id or session id, within each
    completion's own project. Call it in the transaction that inserts them.
    """
    count = 0
    now = utcnow()
    by_project: dict[str, list[LandedCall]] = {}
    for c in completions:
        by_project.setdefault(c.project_id, []).append(c)
    for project_id, comps in by_project.items():
        targets = Targets(comps)
        conds = [
            and_(Feedback.target_kind == "completion_id", Feedback.target_id.in_(targets.by_id)),
            and_(Feedback.target_kind == "session_id", Feedback.target_id.in_(targets.sessions)),
        ]
        if targets.by_request:
            conds.append(and_(Feedback.target_kind == "client_request_id", Feedback.target_id.in_(targets.by_request)))
        stmt = select(Feedback).where(Feedback.project_id == project_id, Feedback.attached_at.is_(None), or_(*conds))
        for fb in (await db.scalars(stmt)).all():
            fb.completion_id, fb.session_id = targets.resolve(fb.target_kind, fb.target_id)
            fb.attached_at = now
            count += 1
    return count


def pending_stmt(project_id: str | None = None, older_than: datetime | None = None) -> Select[Feedback]:
    stmt = select(Feedback).where(Feedback.attached_at.is_(None))
    if project_id is not None:
        stmt = stmt.where(Feedback.project_id == project_id)
    if older_than is not None:
        stmt = stmt.where(Feedback.created_at < older_than)
    return stmt


Cursor = tuple[datetime, str]  # (created_at, id) of the last pending item a sweep looked at


@dataclass(frozen=True)
class Swept:
    """What one sweep did, and where the next one starts (None: at the oldest item of the window)."""

    attached: int
    looked: int
    after: Cursor | None


def sweep_pending(
    db: DbSession,
    *,
    after: Cursor | None = None,
    ttl: timedelta = ORPHAN_TTL,
    now: datetime | None = None,
    project_id: str | None = None,
    page: int = 500,
    pages: int | None = None,
) -> Swept:
    """Attach pending items of the last ``ttl`` whose target has landed, walking from ``after`` by
    ``(created_at, id)``, ``page`` items a query, at most ``pages`` pages (None: to the end).

    Reaching the end, the next sweep starts again at the oldest item of the window. Does not commit.
    """
    cutoff = (now or utcnow()) - ttl
    attached = looked = 0
    done = 0
    while pages is None or done < pages:
        stmt = pending_stmt(project_id).where(Feedback.created_at >= cutoff)
        if after is not None:
            at, last = after
            stmt = stmt.where(or_(Feedback.created_at > at, and_(Feedback.created_at == at, Feedback.id > last)))
        rows = list(db.scalars(stmt.order_by(Feedback.created_at, Feedback.id).limit(page)))
        done += 1
        looked += len(rows)
        attached += _attach_page(db, rows)
        if len(rows) < page:
            return Swept(attached, looked, None)
        after = (rows[-1].created_at, rows[-1].id)
    return Swept(attached, looked, after)


def _attach_page(db: DbSession, rows: Sequence[Feedback]) -> int:
    """Attach those of ``rows`` whose target is recorded in their project; how many. Three queries a project."""
    by_project: dict[str, list[Feedback]] = {}
    for row in rows:
        by_project.setdefault(row.project_id, []).append(row)
    count, now = 0, utcnow()
    for project, items in by_project.items():
        wanted: dict[str, set[str]] = {"completion_id": set(), "client_request_id": set(), "session_id": set()}
        for row in items:
            wanted.setdefault(row.target_kind, set()).add(row.target_id)
        cols = (Completion.id, Completion.session_id, Completion.client_request_id, Completion.created_at)
        mine = select(*cols).where(Completion.project_id == project)
        calls = (
            [
                *db.execute(mine.where(Completion.id.in_(wanted["completion_id"]))).all(),
                *db.execute(mine.where(Completion.client_request_id.in_(wanted["client_request_id"]))).all(),
            ]
            if wanted["completion_id"] or wanted["client_request_id"]
            else []
        )
        sessions: set[str] = set()
        if wanted["session_id"]:
            sessions.update(
                db.scalars(
                    select(Session.id).where(Session.project_id == project, Session.id.in_(wanted["session_id"]))
                )
            )
            sessions.update(
                db.scalars(
                    select(Completion.session_id)
                    .distinct()
                    .where(Completion.project_id == project, Completion.session_id.in_(wanted["session_id"]))
                )
            )
        targets = Targets(calls, sessions)
        for row in items:
            completion_id, session_id = targets.resolve(row.target_kind, row.target_id)
            if session_id is not None:
                row.completion_id, row.session_id, row.attached_at = completion_id, session_id, now
                count += 1
    if count:
        db.flush()
    return count


async def attach_orphans(db: AsyncSession, project_id: str | None = None, limit: int = 500) -> int:
    """One whole sweep (:func:`sweep_pending`, ``limit`` items a query): attach pending items of the last TTL
    whose target has landed since. The housekeeper (storage/housekeep.py) sweeps a bounded part at a time."""
    swept = await db.run_sync(lambda s: sweep_pending(s, project_id=project_id, page=limit))
    return swept.attached


def orphans_stmt(
    ttl: timedelta = ORPHAN_TTL, project_id: str | None = None, now: datetime | None = None
) -> Select[int]:
    """How many pending items are older than ``ttl`` (aged out of the sweep: their target never landed)."""
    sub = pending_stmt(project_id, (now or datetime.now(UTC)) - ttl).subquery()
    return select(func.count()).select_from(sub)


async def count_orphans(
    db: AsyncSession, *, ttl: timedelta = ORPHAN_TTL, project_id: str | None = None, now: datetime | None = None
) -> int:
    """Pending feedback older than ``ttl``: its target never landed (or never existed here)."""
    return int(await db.scalar(orphans_stmt(ttl, project_id, now)) or 0)
