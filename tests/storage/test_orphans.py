"""The sweep of pending feedback (storage/feedback.py): by cursor, never starved by items that cannot attach,
and items older than the TTL aged out (counted, not swept again)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from storage import feedback
from storage.db import async_engine
from storage.feedback import ORPHAN_TTL, attach_orphans, count_orphans, new_feedback_id
from storage.models import Completion, Feedback, utcnow
from tests.storage.rows import insert, new_project, row
from tests.storage.test_trajectories import P1


def _pending(db: Session, project: str, kind: str, target: str, age: timedelta = timedelta(0)) -> str:
    fid = new_feedback_id()
    db.add(
        Feedback(
            id=fid,
            project_id=project,
            idempotency_key=fid,
            target_kind=kind,
            target_id=target,
            name="thumbs",
            value=True,
            source="",
            meta={},
            created_at=utcnow() - age,
        )
    )
    return fid


def _never(db: Session, project: str, n: int) -> None:
    """``n`` pending items naming calls that never land, older than anything after them."""
    for i in range(n):
        _pending(db, project, "completion_id", f"cmpl-never-{i}", age=timedelta(minutes=30) - timedelta(seconds=i))
    db.flush()


def _attached(db: Session, fid: str) -> bool:
    db.expire_all()
    return db.scalar(select(Feedback.attached_at).where(Feedback.id == fid)) is not None


@pytest.fixture
async def adb(pg_url: str) -> AsyncIterator[AsyncSession]:
    eng = async_engine(pg_url, poolclass=NullPool)
    async with AsyncSession(eng, expire_on_commit=False) as session:
        yield session
    await eng.dispose()


@pytest.mark.anyio
async def test_600_items_that_never_attach_do_not_starve_a_newer_one(db: Session, adb: AsyncSession) -> None:
    """The old sweep took the oldest 500 pending items each time: with 600 that never attach, the newer one
    whose call landed (without the recorder's attach_pending: the race the sweep is for) never attached."""
    project = new_project(db)
    _never(db, project, 600)
    late = f"cmpl-late-{uuid.uuid4().hex[:8]}"
    fid = _pending(db, project, "completion_id", late)
    insert(db, row(late, P1, [], project=project, session="s-late"))
    db.commit()
    assert await attach_orphans(adb, project) == 1
    await adb.commit()
    assert _attached(db, fid)
    attached = db.scalar(select(Feedback.session_id).where(Feedback.id == fid))
    assert attached == "s-late"


def test_a_bounded_sweep_walks_on_from_its_cursor_and_wraps_round(db: Session) -> None:
    project = new_project(db)
    _never(db, project, 600)
    late = f"cmpl-late-{uuid.uuid4().hex[:8]}"
    by_request = f"req-{uuid.uuid4().hex[:8]}"
    items = [
        _pending(db, project, "completion_id", late),
        _pending(db, project, "client_request_id", by_request),
        _pending(db, project, "session_id", "s-late"),
    ]
    insert(db, row(late, P1, [], project=project, session="s-late", crid=by_request))
    db.commit()
    first = feedback.sweep_pending(db, project_id=project, page=500, pages=1)
    assert (first.attached, first.looked) == (0, 500) and first.after is not None
    second = feedback.sweep_pending(db, after=first.after, project_id=project, page=500, pages=1)
    assert (second.attached, second.looked, second.after) == (3, 103, None)  # the end: the next starts over
    db.commit()
    assert all(_attached(db, fid) for fid in items)
    again = feedback.sweep_pending(db, project_id=project, page=500)
    assert (again.attached, again.looked, again.after) == (0, 600, None)


def test_items_older_than_the_ttl_are_aged_out_and_counted(db: Session) -> None:
    """An item past its TTL is not swept again (counted as an orphan instead), even if its call landed."""
    project = new_project(db)
    gone = f"cmpl-aged-{uuid.uuid4().hex[:8]}"
    aged = _pending(db, project, "completion_id", gone, age=ORPHAN_TTL + timedelta(minutes=5))
    _never(db, project, 3)
    insert(db, row(gone, P1, [], project=project, session="s-aged"))
    db.commit()
    swept = feedback.sweep_pending(db, project_id=project)
    assert (swept.attached, swept.looked) == (0, 3)
    assert not _attached(db, aged)
    assert (
        feedback.sweep_pending(db, project_id=project, ttl=timedelta(hours=2)).attached == 1
    )  # within a longer TTL: it is
    db.rollback()


@pytest.mark.anyio
async def test_aged_out_items_are_what_count_orphans_exports(db: Session, adb: AsyncSession) -> None:
    project = new_project(db)
    _pending(db, project, "completion_id", "cmpl-never", age=ORPHAN_TTL + timedelta(minutes=5))
    _never(db, project, 2)
    db.commit()
    assert await count_orphans(adb, project_id=project) == 1
    assert db.scalar(select(Completion.id).where(Completion.project_id == project)) is None
