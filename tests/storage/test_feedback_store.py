"""Storing feedback against the real Postgres: attach or pend, idempotency, revisions, late attach, orphans."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from storage import feedback as feedback_module
from storage.db import async_engine, sync_engine
from storage.feedback import attach_orphans, attach_pending, count_orphans, submit_feedback
from storage.feedback_input import FeedbackConflict, parse_feedback
from storage.feedback_read import list_feedback
from storage.grading import resolve_grades
from storage.migrate import upgrade
from storage.models import Completion, Feedback, Project, utcnow
from tests.storage.rows import insert, new_project, row
from tests.storage.test_trajectories import P1

pytestmark = pytest.mark.anyio


@dataclass
class World:
    a: str  # the caller's project
    b: str  # another project, with the same session name and its own completion
    a1: str
    b1: str


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def world(pg_url: str) -> Iterator[World]:
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        a, b = new_project(db), new_project(db)
        a1, b1 = _uid("cmpl-a"), _uid("cmpl-b")
        insert(db, row(a1, P1, [], project=a, session="s1", crid="req-1"), row(b1, P1, [], project=b, session="s1"))
        db.commit()
    yield World(a, b, a1, b1)
    eng.dispose()


@pytest.fixture
async def adb(pg_url: str) -> AsyncIterator[AsyncSession]:
    eng = async_engine(pg_url, poolclass=NullPool)
    async with AsyncSession(eng, expire_on_commit=False) as db:
        yield db
    await eng.dispose()


def item(kind: str, target: str, name: str = "thumbs", value: object = True, **extra: object) -> object:
    return parse_feedback({"target": {kind: target}, "name": name, "value": value, **extra})[0][0]


async def test_known_targets_attach_unknown_and_foreign_ones_pend(adb: AsyncSession, world: World) -> None:
    items = [
        item("completion_id", world.a1),
        item("client_request_id", "req-1"),
        item("session_id", "s1"),
        item("completion_id", "cmpl-nowhere"),
        item("completion_id", world.b1),
        item("session_id", "s-nowhere"),
    ]
    rows = await submit_feedback(adb, world.a, items)  # type: ignore[arg-type]
    await adb.commit()
    got = [(r.completion_id, r.session_id, r.attached_at is not None) for r in rows]
    assert got == [
        (world.a1, "s1", True),
        (world.a1, "s1", True),
        (None, "s1", True),
        (None, None, False),
        (None, None, False),
        (None, None, False),
    ]
    # Another project's completion id looks exactly like an unknown one, and B sees nothing of it.
    assert await list_feedback(adb, world.b, completion_id=world.b1) == []


async def test_pending_attaches_when_the_call_lands_in_the_same_project_only(adb: AsyncSession, world: World) -> None:
    future, foreign = _uid("cmpl-future"), _uid("cmpl-b")
    items = [
        item("completion_id", future),
        item("client_request_id", "req-later"),
        item("session_id", "s-later"),
        item("completion_id", foreign),
    ]
    await submit_feedback(adb, world.a, items)  # type: ignore[arg-type]
    await adb.commit()
    # Project B records a call with the same client request id and session, and the foreign id: nothing attaches.
    theirs = [Completion(**row(foreign, P1, [], project=world.b, session="s-later", crid="req-later"))]
    adb.add_all(theirs)
    assert await attach_pending(adb, theirs) == 0
    ours = [
        Completion(**row(future, P1, [], project=world.a, session="s-later")),
        Completion(**row(_uid("cmpl-a"), P1, [], project=world.a, session="s9", crid="req-later", at=5)),
    ]
    adb.add_all(ours)
    assert await attach_pending(adb, ours) == 3
    await adb.commit()
    stored = {
        (f.target_kind, f.target_id): f
        for f in (await adb.scalars(select(Feedback).where(Feedback.project_id == world.a))).all()
    }
    assert stored[("completion_id", future)].session_id == "s-later"
    assert stored[("client_request_id", "req-later")].completion_id == ours[1].id
    assert stored[("session_id", "s-later")].completion_id is None
    assert stored[("completion_id", foreign)].attached_at is None
    assert await attach_orphans(adb, world.a) == 0  # the sweep does not cross projects either


async def test_sweep_attaches_what_landed_without_attach_pending(adb: AsyncSession, world: World) -> None:
    late = _uid("cmpl-late")
    await submit_feedback(adb, world.a, [item("completion_id", late)])  # type: ignore[list-item]
    adb.add(Completion(**row(late, P1, [], project=world.a, session="s7")))
    await adb.commit()
    assert await attach_orphans(adb, world.a) == 1
    [fb] = await list_feedback(adb, world.a, completion_id=late)
    assert (fb["status"], fb["session_id"]) == ("attached", "s7")


async def test_idempotent_retry_returns_the_stored_item(adb: AsyncSession, world: World) -> None:
    first = await submit_feedback(adb, world.a, [item("completion_id", world.a1, id="k-1")])  # type: ignore[list-item]
    await adb.commit()
    again = await submit_feedback(adb, world.a, [item("completion_id", world.a1, id="k-1")])  # type: ignore[list-item]
    first_id = first[0].id
    assert again[0].id == first_id
    with pytest.raises(FeedbackConflict, match="new id"):
        await submit_feedback(adb, world.a, [item("completion_id", world.a1, value=False, id="k-1")])  # type: ignore[list-item]
    await adb.rollback()
    # The same key in another project is another item.
    other = await submit_feedback(adb, world.b, [item("completion_id", world.b1, id="k-1")])  # type: ignore[list-item]
    assert other[0].id != first_id and other[0].attached_at is not None
    await adb.commit()
    keys = select(func.count()).where(Feedback.idempotency_key == "k-1", Feedback.project_id.in_([world.a, world.b]))
    assert await adb.scalar(keys) == 2


async def test_a_retry_losing_the_insert_race_returns_the_winner(
    adb: AsyncSession, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    [winner] = await submit_feedback(adb, world.a, [item("session_id", "s1", id="k-race")])  # type: ignore[list-item]
    winner_id = winner.id
    await adb.commit()
    # Replay the race deterministically: the loser's first look finds nothing (the winner
    # had not committed yet), so its insert hits the unique index.
    real = feedback_module._by_key
    calls: list[str] = []

    async def first_look_misses(db: AsyncSession, project_id: str, key: str) -> Feedback | None:
        calls.append(key)
        return None if len(calls) == 1 else await real(db, project_id, key)

    monkeypatch.setattr(feedback_module, "_by_key", first_look_misses)
    [loser] = await submit_feedback(adb, world.a, [item("session_id", "s1", id="k-race")])  # type: ignore[list-item]
    await adb.commit()
    assert (loser.id, len(calls)) == (winner_id, 2)
    assert await adb.scalar(select(func.count()).where(Feedback.idempotency_key == "k-race")) == 1


async def test_revisions_keep_history_and_mark_the_winner(adb: AsyncSession, world: World) -> None:
    for value in (0.2, 0.9):
        await submit_feedback(adb, world.a, [item("session_id", "s1", "reward", value, source="grader")])  # type: ignore[list-item]
    await submit_feedback(adb, world.a, [item("session_id", "s1", "review", None, comment="ok")])  # type: ignore[list-item]
    await adb.commit()
    history = [f for f in await list_feedback(adb, world.a, session_id="s1") if f["name"] in ("reward", "review")]
    assert [(f["value"], f["current"]) for f in history] == [(0.2, False), (0.9, True), (None, True)]


async def test_orphans_are_pending_items_older_than_the_ttl(adb: AsyncSession, world: World) -> None:
    await submit_feedback(adb, world.a, [item("completion_id", _uid("cmpl-never"))])  # type: ignore[list-item]
    await adb.commit()
    assert await count_orphans(adb, project_id=world.a) == 0
    later = utcnow() + timedelta(hours=2)
    assert await count_orphans(adb, project_id=world.a, now=later) == 1
    assert await count_orphans(adb, project_id=world.a, now=later, ttl=timedelta(hours=3)) == 0


async def test_sqlite_too_and_feedback_before_the_project_exists(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    upgrade(url)
    eng = async_engine(url, poolclass=NullPool)
    async with AsyncSession(eng, expire_on_commit=False) as db:
        # A fresh install: the recorder creates project rows lazily, feedback may come first.
        [early] = await submit_feedback(db, "fresh", [item("completion_id", "cmpl-1", id="k")])  # type: ignore[list-item]
        await db.commit()
        assert early.attached_at is None and await db.get(Project, "fresh") is not None
        call = Completion(**row("cmpl-1", [1, 2], [], project="fresh", session="s"))
        db.add(call)
        assert await attach_pending(db, [call]) == 1
        await db.commit()
        [again] = await submit_feedback(db, "fresh", [item("completion_id", "cmpl-1", id="k")])  # type: ignore[list-item]
        assert again.id == early.id and again.session_id == "s"
        assert [f["status"] for f in await list_feedback(db, "fresh", session_id="s")] == ["attached"]
    await eng.dispose()


async def test_the_database_the_recorder_and_the_loaders_resolve_a_target_alike(
    adb: AsyncSession, world: World
) -> None:
    """A client request id used twice names its newest call, whichever path resolves it (storage.grading)."""
    old, new = _uid("cmpl-old"), _uid("cmpl-new")
    calls = [
        Completion(**row(new, P1, [], project=world.a, session="s-new", crid="req-twice", at=9)),
        Completion(**row(old, P1, [], project=world.a, session="s-old", crid="req-twice", at=1)),
    ]
    # The loaders: still pending, resolved in memory against the loaded calls.
    [pending] = await submit_feedback(adb, world.a, [item("client_request_id", "req-twice")])  # type: ignore[list-item]
    assert pending.attached_at is None
    [grade] = resolve_grades([pending], calls)
    # The recorder: the calls land in one batch and the pending item attaches.
    adb.add_all(calls)
    assert await attach_pending(adb, calls) == 1
    # The database: an item sent after both calls landed.
    [direct] = await submit_feedback(adb, world.a, [item("client_request_id", "req-twice", name="reward", value=1)])  # type: ignore[list-item]
    await adb.commit()
    assert (
        (grade.completion_id, grade.session_id)
        == (pending.completion_id, pending.session_id)
        == (direct.completion_id, direct.session_id)
        == (new, "s-new")
    )
