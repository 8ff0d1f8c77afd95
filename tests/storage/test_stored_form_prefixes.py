"""The delta form's shared prefixes (one per project, counted) and its batched reads (storage/stored_form.py).

The corpus of tests/storage/test_stored_form.py, recorded in the delta form: its sessions of project
``p`` share one system prompt and tool list, and a session of project ``q`` has the same ones.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session

from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.spool import Spool
from storage.db import async_engine, sync_engine
from storage.deletion import delete_session
from storage.migrate import upgrade
from storage.models import Completion, StoredPrefix
from storage.retention import expire
from storage.stored_form import MARK, is_delta
from tests.storage.test_stored_form import CHECKPOINT, chain, reads, record_both

pytestmark = pytest.mark.anyio


def prefixes(db: Session) -> dict[str, int]:
    return {p: refs for p, refs in db.execute(select(StoredPrefix.project_id, StoredPrefix.refs))}


def referencing(db: Session) -> dict[str, int]:
    """How many rows of each project reference a shared prefix (what ``refs`` counts)."""
    out: dict[str, int] = {}
    for project, request in db.execute(select(Completion.project_id, Completion.request)):
        if is_delta(request) and "prefix" in request[MARK]:
            out[project] = out.get(project, 0) + 1
    return out


def databases(pg_factory: Any, tmp_path: Path, backend: str) -> tuple[str, str]:
    if backend == "postgres":
        return pg_factory(), pg_factory()
    urls = f"sqlite:///{tmp_path / 'full.db'}", f"sqlite:///{tmp_path / 'delta.db'}"
    for url in urls:
        upgrade(url)
    return urls


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_a_prefix_is_stored_once_a_project_and_counted(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    url_full, url_delta = databases(pg_factory, tmp_path, backend)
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    eng = sync_engine(url_delta)
    with Session(eng) as db:
        hashes = set(db.scalars(select(StoredPrefix.hash)))
        assert len(hashes) == 1  # the same text in both projects: one hash...
        assert prefixes(db) == referencing(db) == {"p": 2 + 1 + 1 + 1 + 1, "q": 1}  # ...a copy each
        # ses_long: its first call and two checkpoints; ses_branch's first call, and its fork (not an
        # extension of its parent); ses_redacted's first call. Its redacted call has no tools: none.
        delete_session(db, "p", "ses_long")
        db.commit()
        assert prefixes(db) == referencing(db) == {"p": 3, "q": 1}
        for session in ("ses_branch", "ses_redacted"):
            delete_session(db, "p", session)
        db.commit()
        assert prefixes(db) == {"q": 1}  # no row of p references it: gone; q's copy stays
    eng.dispose()
    assert reads(url_delta)["rows"] == [
        r
        for r in reads(url_full)["rows"]
        if r[5] == "responses" or r[0] in {row[0] for row in reads(url_delta)["rows"]}
    ]


def test_retention_releases_what_expired_calls_reference(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url_full, url_delta = pg_factory(), pg_factory()
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    eng = sync_engine(url_delta)
    with Session(eng) as db:
        expire(db, "p", datetime(2026, 11, 30, 12, 0, 5, 0, UTC))  # every session's first call goes
        assert prefixes(db) == referencing(db) == {"p": 3, "q": 1}  # ses_long's two checkpoints, the fork
        expire(db, "p", datetime(2026, 11, 30, 13, 0, 0, 0, UTC))
        assert prefixes(db) == {"q": 1}
    eng.dispose()


def test_reading_a_chain_is_one_query(pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url_full, url_delta = pg_factory(), pg_factory()
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    eng = sync_engine(url_delta)
    statements: list[str] = []
    event.listen(eng, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with Session(eng) as db:
        calls = list(
            db.scalars(select(Completion).where(Completion.session_id == "ses_long").order_by(Completion.created_at))
        )
        assert len(calls) == 2 * CHECKPOINT + 8
        # The first call is a chain's first row (its prefix: one query); every other call's parent was
        # loaded before it. Whatever the order, a query's rows share what was expanded.
        assert len(statements) == 2, statements
        db.expunge_all()
        statements.clear()
        last = db.scalars(select(Completion).where(Completion.id == calls[-1].id)).one()
        assert len(statements) == 3  # the row, its chain back to the checkpoint, the prefix
        assert last.request == calls[-1].request and last.prompt_token_ids == calls[-1].prompt_token_ids
        db.expunge_all()
        statements.clear()
        backwards = list(
            db.scalars(
                select(Completion).where(Completion.session_id == "ses_long").order_by(Completion.created_at.desc())
            )
        )
        assert len(statements) <= 2 + 3  # one chain and prefix query a checkpoint at most
        assert [c.request for c in backwards] == [c.request for c in reversed(calls)]
    eng.dispose()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_a_child_of_a_call_deleted_since_it_was_committed_is_stored_in_full(
    pg_factory: Any, tmp_path: Path, backend: str
) -> None:
    """The recorder remembers the calls it committed, to store their children as deltas. A session delete
    (or retention) may take one of them afterwards while a worker's link cache still continues it; a child
    stored as a delta of it could never be read back (its chain is broken). Here: ``ses_a``'s first two calls
    are committed, the session is deleted, and its third call (made after the delete: it lands, starting the
    session afresh) arrives with the deleted second call as parent. It must go in full and read back whole.
    It fails without the parent check in the inserting transaction (``Encoder.settle``): the read raises."""
    url = databases(pg_factory, tmp_path, backend)[1]
    calls = chain("ses_a", 3)
    engine = async_engine(url)
    spool = Spool(tmp_path / "spool", 10**9)
    recorder = Recorder(spool, async_sessionmaker(engine, expire_on_commit=False), Metrics(), batch=500)
    for r in calls[:2]:
        await spool.append(r)
        while spool.depth:
            await recorder.drain_once()
    eng = sync_engine(url)
    with Session(eng) as db:
        delete_session(db, "p", "ses_a")
        db.commit()
    later = replace(calls[2], created_at=datetime.now(UTC).isoformat())
    await spool.append(later)
    while spool.depth:
        await recorder.drain_once()
    await recorder.close()
    spool.close()
    await engine.dispose()
    with Session(eng) as db:
        stored = db.execute(select(Completion.request).where(Completion.id == later.id)).scalar_one()
        assert not (is_delta(stored) and "parent" in stored[MARK])  # in full (it may reference the prefix)
        row = db.scalars(select(Completion).where(Completion.id == later.id)).one()
        assert row.request == orjson.loads(later.request)
        assert row.prompt_token_ids == orjson.loads(later.prompt_token_ids)
        assert prefixes(db) == referencing(db)
    eng.dispose()
