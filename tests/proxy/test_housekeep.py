"""Housekeeping (storage/housekeep.py): one schedule, each job under its advisory lock, in `onthejob housekeep`
and in a thread of the proxy (never its event loop)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from onthejob.cli import main
from proxy.app import create_app
from proxy.settings import Settings
from storage.db import sync_engine
from storage.feedback import new_feedback_id
from storage.housekeep import Housekeeper, Schedule, exclusive
from storage.models import Completion, Feedback, Project, utcnow
from tests.storage.rows import insert, new_project, row
from tests.storage.test_trajectories import P1


def _world(db: Session) -> tuple[str, str, str]:
    """A project keeping calls a day, with a call from 2026-01-01 (older than that) and a pending item
    whose call has landed (as if feedback and call had committed at the same moment)."""
    project = new_project(db, {"retention_days": 1})
    ancient, late = f"ancient-{uuid.uuid4().hex[:8]}", f"late-{uuid.uuid4().hex[:8]}"
    fid = new_feedback_id()
    db.add(
        Feedback(
            id=fid,
            project_id=project,
            idempotency_key=fid,
            target_kind="completion_id",
            target_id=late,
            name="thumbs",
            value=True,
            source="",
            meta={},
            created_at=utcnow(),
        )
    )
    late_row = row(late, P1, [], project=project, session="s-late")
    late_row["created_at"] = utcnow()
    insert(db, row(ancient, P1, [], project=project, session="s-old"), late_row)
    db.commit()
    return project, ancient, fid


def _state(db: Session, project: str, ancient: str, fid: str) -> tuple[bool, bool]:
    """(the ancient call is gone, the pending item attached)."""
    db.expire_all()
    attached = db.scalar(select(Feedback.attached_at).where(Feedback.id == fid)) is not None
    return db.get(Completion, ancient) is None, attached


def test_the_jobs_run_once_and_a_second_copy_skips_a_job_another_holds(pg_url: str, db: Session) -> None:
    project, ancient, fid = _world(db)
    eng = sync_engine(pg_url)
    reports: list[tuple[str, dict[str, Any]]] = []
    keeper = Housekeeper(eng, Schedule(), report=lambda job, result: reports.append((job, result)))
    with exclusive(eng, "retention") as held:  # another copy is running retention
        assert held is not None
        with exclusive(eng, "retention") as second:
            assert second is None  # the lock is exclusive across connections
        done = keeper.run_all()
    assert done["retention"] is None and keeper.runs["retention", "skipped"] == 1
    assert done["sweep"] is not None and done["sweep"]["attached"] >= 1
    assert done["prune"] is not None
    assert _state(db, project, ancient, fid) == (False, True)  # swept; retention left to the other copy
    assert keeper.run(keeper.jobs[1]) is not None  # the lock is free again
    assert _state(db, project, ancient, fid) == (True, True)
    assert [job for job, _ in reports] == ["sweep", "prune", "retention"]
    eng.dispose()


def test_run_due_follows_the_schedule(pg_url: str) -> None:
    eng = sync_engine(pg_url)
    keeper = Housekeeper(eng, Schedule(sweep_every_s=5, retention_every_s=0, prune_every_s=60))
    start = min(job.due for job in keeper.jobs)
    assert list(keeper.run_due(start)) == ["prune"]  # retention off; the sweep after one period
    assert list(keeper.run_due(start + 1)) == []
    assert list(keeper.run_due(start + 6)) == ["sweep"]
    assert list(keeper.run_due(start + 61)) == ["sweep", "prune"]
    eng.dispose()


def test_a_failing_job_is_counted_and_the_others_still_run(tmp_path: Path) -> None:
    eng = sync_engine(f"sqlite:///{tmp_path / 'nothing.db'}")  # no schema: every job fails
    keeper = Housekeeper(eng, Schedule())
    assert keeper.run_all() == {"sweep": None, "retention": None, "prune": None}
    assert {key for key, n in keeper.runs.items() if n} == {
        ("sweep", "failed"),
        ("retention", "failed"),
        ("prune", "failed"),
    }
    eng.dispose()


def test_onthejob_housekeep_once(pg_url: str, db: Session, capsys: pytest.CaptureFixture[str]) -> None:
    project, ancient, fid = _world(db)
    assert main(["housekeep", "--once", "--db", pg_url]) == 0
    assert _state(db, project, ancient, fid) == (True, True)
    err = capsys.readouterr().err
    assert "sweep: {'attached'" in err and f"'{project}': {{'calls': 1" in err
    assert main(["housekeep", "--once", "--db", pg_url, "--sweep-every", "-1"]) == 2


@pytest.fixture
async def proxy_app(pg_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    settings = Settings(
        upstreams=["http://127.0.0.1:1"],
        database_url=pg_url,
        spool_dir=tmp_path / "spool",
        auth=False,
        reconcile_every_s=0.2,
        retention_every_s=0.2,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.mark.anyio
async def test_the_proxy_runs_the_jobs_in_a_thread_and_exports_orphans(proxy_app: Any, db: Session) -> None:
    project, ancient, fid = _world(db)
    old = new_feedback_id()  # an orphan: pending past its TTL
    db.add(
        Feedback(
            id=old,
            project_id=project,
            idempotency_key=old,
            target_kind="completion_id",
            target_id="cmpl-never",
            name="thumbs",
            value=True,
            source="",
            meta={},
            created_at=utcnow() - timedelta(hours=2),
        )
    )
    db.commit()
    state = proxy_app.state.onthejob
    assert state.housekeeper is not None
    thread, _ = state._housekeeping
    assert thread is not threading.current_thread() and thread.is_alive()
    done = threading.Event()
    report = state.housekeeper.report

    def seen(job: str, result: dict[str, Any]) -> None:
        report(job, result)
        if _state(db_probe, project, ancient, fid) == (True, True) and job == "sweep":
            done.set()

    with Session(sync_engine(state.settings.database_url)) as db_probe:
        state.housekeeper.report = seen
        assert await _wait(done)
    transport = httpx.ASGITransport(app=proxy_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        metrics = (await client.get("/metrics")).text
    orphans = [line for line in metrics.splitlines() if line.startswith("onthejob_feedback_orphans ")]
    assert orphans and float(orphans[0].split()[1]) >= 1
    assert db.get(Project, project) is not None


async def _wait(event: threading.Event) -> bool:
    import asyncio

    return await asyncio.to_thread(event.wait, 30)


def test_serve_no_housekeep_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from onthejob.cli import build_parser
    from onthejob.commands import proxy_settings

    monkeypatch.delenv("ONTHEJOB_HOUSEKEEP", raising=False)
    assert proxy_settings(build_parser().parse_args(["serve"])).housekeep
    assert not proxy_settings(build_parser().parse_args(["serve", "--no-housekeep"])).housekeep
    monkeypatch.setenv("ONTHEJOB_HOUSEKEEP", "0")  # what --no-housekeep leaves for --workers N
    assert not Settings().housekeep
