"""The recorder's two write paths (Postgres COPY, portable executemany) store the same rows.

The records are shaped as ``ProxiedCall.save`` writes them (tests/proxy/records.py). Also: a replayed
segment (already stored) writes nothing twice, pending feedback attaches on either
path, and a record the database refuses is quarantined without holding back the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.spool import Spool
from storage import bulk
from storage.db import async_engine
from storage.models import Feedback, Project
from storage.records import CallRecord
from tests.proxy.records import record

pytestmark = pytest.mark.anyio


@pytest.fixture
async def engine(pg_factory: Any) -> AsyncIterator[AsyncEngine]:
    eng = async_engine(pg_factory())
    yield eng
    await eng.dispose()


async def drain(engine: AsyncEngine, folder: Path, records: list[CallRecord]) -> Recorder:
    spool = Spool(folder, 10**9)
    await asyncio.gather(*(spool.append(r) for r in records))
    recorder = Recorder(spool, async_sessionmaker(engine, expire_on_commit=False), Metrics(), batch=500)
    while spool.depth:
        await recorder.drain_once()
    await recorder.close()
    spool.close()
    return recorder


async def stored(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    """Every completion column as Postgres holds it (JSON as text, and whether it is SQL NULL)."""
    cols = ", ".join(f"{c} IS NULL, {c}::text" for c in bulk.COLUMNS)
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(f"SELECT {cols} FROM completions ORDER BY id"))).all()]


async def test_copy_and_portable_paths_store_identical_rows(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last one spells COPY's escapes (tab, newline, carriage return, backslash, \\N) in text and in JSON.
    tricky = {"error": "a\tb\nc\rd \\ \\N", "request": {"content": 'x "\\" \t\n'}, "client_request_id": "\\N"}
    records = [record(i) for i in range(7)] + [record(7, session="ses_1"), record(8, session="ses_2", **tricky)]
    fast, slow = async_engine(pg_factory()), async_engine(pg_factory())
    calls = {"copy": 0}
    real_copy = bulk.copy_completions

    async def counting(conn: Any, rows: list[CallRecord]) -> None:
        await real_copy(conn, rows)
        calls["copy"] += 1  # counted once COPY took the batch (the portable path would hide a refused one)

    monkeypatch.setattr(bulk, "copy_completions", counting)
    await drain(fast, tmp_path / "fast", records)
    assert calls["copy"] == 1

    async def refuse(conn: Any, rows: list[CallRecord]) -> None:
        raise psycopg.errors.UniqueViolation("as if already stored")

    monkeypatch.setattr(bulk, "copy_completions", refuse)
    await drain(slow, tmp_path / "slow", records)
    try:
        got_fast, got_slow = await stored(fast), await stored(slow)
        assert len(got_fast) == 9
        assert got_fast == got_slow
        for eng in (fast, slow):
            async with eng.connect() as conn:
                sessions = (
                    await conn.execute(
                        text("SELECT project_id, id, task_id, source, tags::text FROM sessions ORDER BY id")
                    )
                ).all()
                assert [s.id for s in sessions] == [f"ses_{i}" for i in range(7)]
                assert sessions[1].tags == '["a","ü"]'  # a session takes its calls' tags
    finally:
        await fast.dispose()
        await slow.dispose()


async def test_a_replayed_segment_writes_nothing_twice(engine: AsyncEngine, tmp_path: Path) -> None:
    first = [record(i) for i in range(3)]
    await drain(engine, tmp_path / "a", first)
    # A crash between the commit and the segment's deletion: the same records come again, with new ones.
    again = [*first, record(3)]
    await drain(engine, tmp_path / "b", again)
    rows = await stored(engine)
    assert len(rows) == 4


async def test_pending_feedback_attaches_when_its_call_lands(engine: AsyncEngine, tmp_path: Path) -> None:
    records = [record(i) for i in range(3)]
    target = records[1]
    async with async_sessionmaker(engine)() as db:
        db.add(Project(id="p", settings={}))
        await db.flush()
        for kind, tid in (
            ("completion_id", target.id),
            ("client_request_id", "req-2"),
            ("session_id", "ses_0"),
            ("completion_id", "cmpl-never"),
        ):
            db.add(
                Feedback(
                    id=f"fb-{tid}",
                    project_id="p",
                    idempotency_key=tid,
                    target_kind=kind,
                    target_id=tid,
                    name="thumbs",
                    value=True,
                    source="",
                    meta={},
                )
            )
        await db.commit()
    await drain(engine, tmp_path / "s", records)
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT target_id, completion_id, session_id, attached_at IS NOT NULL AS on_ "
                    "FROM feedback ORDER BY target_id"
                )
            )
        ).all()
    got = {r.target_id: (r.completion_id, r.session_id, r.on_) for r in rows}
    assert got[target.id] == (target.id, "ses_1", True)
    assert got["req-2"] == (records[2].id, "ses_2", True)
    assert got["ses_0"] == (None, "ses_0", True)
    assert got["cmpl-never"] == (None, None, False)


async def test_a_refused_record_is_quarantined_and_the_rest_stored(engine: AsyncEngine, tmp_path: Path) -> None:
    records = [record(i) for i in range(4)]
    records[2].upstream_id = "bad\u0000id"  # Postgres text cannot hold a NUL
    recorder = await drain(engine, tmp_path / "q", records)
    ids = {r.id for r in records}
    async with engine.connect() as conn:
        landed = set((await conn.execute(text("SELECT id FROM completions"))).scalars())
    assert landed == ids - {records[2].id}
    quarantined = [orjson.loads(line) for line in (tmp_path / "q" / "quarantine.jsonl").read_bytes().splitlines()]
    assert [q["record"]["completion"]["id"] for q in quarantined] == [records[2].id]
    assert recorder.written == 4


async def test_a_nul_in_a_session_tag_is_stored_the_portable_way(engine: AsyncEngine, tmp_path: Path) -> None:
    records = [record(0), record(1, tags=["nul\u0000tag"])]  # JSON text may hold it; Postgres text may not
    await drain(engine, tmp_path / "n", records)
    assert len(await stored(engine)) == 2
    async with engine.connect() as conn:
        tags = (await conn.execute(text("SELECT tags::text FROM sessions WHERE id = 'ses_1'"))).scalar_one()
    assert tags == '["nul\\u0000tag"]'


@pytest.mark.parametrize("portable", [False, True])
async def test_a_deleted_sessions_spooled_calls_never_land(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, portable: bool
) -> None:
    """The delete ran while the calls were still in the spool: at drain time the tombstone drops them."""
    engine = async_engine(pg_factory())
    if portable:
        monkeypatch.setattr(Recorder, "_write_pg", lambda *a: asyncio.sleep(0, result=False))
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO projects (id, settings, created_at) VALUES ('p', '{}', now())"))
            await conn.execute(text("INSERT INTO tombstones VALUES ('p', 'gone', now())"))
        recorder = await drain(
            engine, tmp_path, [record(0, session="gone"), record(1, session="kept"), record(2, session="gone")]
        )
        async with engine.connect() as conn:
            calls = (await conn.execute(text("SELECT session_id FROM completions"))).scalars().all()
            sessions = (await conn.execute(text("SELECT id FROM sessions"))).scalars().all()
        assert calls == ["kept"] and sessions == ["kept"]
        assert recorder.metrics.records_dropped.labels("deleted")._value.get() == 2
    finally:
        await engine.dispose()


@pytest.mark.parametrize("portable", [False, True])
async def test_a_deleted_end_users_spooled_calls_never_land(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, portable: bool
) -> None:
    """Deleted before the database saw their session: calls made before the delete are dropped, later ones land."""
    engine = async_engine(pg_factory())
    if portable:
        monkeypatch.setattr(Recorder, "_write_pg", lambda *a: asyncio.sleep(0, result=False))
    before, after = "2026-11-30T12:00:00+00:00", "2026-11-30T13:00:00+00:00"
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO projects (id, settings, created_at) VALUES ('p', '{}', now())"))
            await conn.execute(text("INSERT INTO end_user_tombstones VALUES ('p', 'alice', '2026-11-30T12:30:00Z')"))
        recorder = await drain(
            engine,
            tmp_path,
            [
                record(0, session="old", end_user="alice", created_at=before),
                record(1, session="old", created_at=before),  # the same session, no user named: goes with it
                record(2, session="new", end_user="alice", created_at=after),
                record(3, session="bob", end_user="bob", created_at=before),
            ],
        )
        async with engine.connect() as conn:
            calls = (await conn.execute(text("SELECT session_id FROM completions ORDER BY 1"))).scalars().all()
            tombs = (await conn.execute(text("SELECT session_id FROM tombstones"))).scalars().all()
        assert calls == ["bob", "new"] and tombs == ["old"]
        assert recorder.metrics.records_dropped.labels("deleted")._value.get() == 2
    finally:
        await engine.dispose()
