"""A trainer holding a session in its backlog never trains on it once the session's delete has returned.

Two places hold it: the feed's backlog (storage.change_reader: sessions read, not handed out yet;
here more are waiting than the feed reads past, so only the deletion entry's check finds it), and a
batch already handed out when the delete returns, before the step (trainer.runner: a real step of
the tiny model). Real Postgres.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import deletion
from storage.db import sync_engine
from storage.feed import TrainingFeed
from storage.keys import ensure_project
from storage.models import UsedFeedback
from storage.trajectories import Trajectory
from tests.storage.rows import GEN, choice, feedback_row, insert, msg, row
from tests.trainer.test_runner import _args
from trainer.runner import run


def _sessions(pg_url: str, n: int) -> str:
    """A project with ``n`` graded sessions s0… of alias "helper", one call each (trajectory ``<project>-i:0``)."""
    project = f"p-{uuid.uuid4().hex[:8]}"
    with Session(sync_engine(pg_url)) as db:
        ensure_project(db, project)
        insert(
            db,
            *(
                row(
                    f"{project}-{i}",
                    msg("user", 40 + i) + GEN,
                    [choice([50 + i, 51, 2], logprobs=None)],
                    session=f"s{i}",
                    project=project,
                    task="add",
                    alias="helper",
                    at=i,
                )
                for i in range(n)
            ),
        )
        db.add_all(
            feedback_row(project, "outcome", "success" if i % 2 else "failure", session=f"s{i}") for i in range(n)
        )
        db.commit()
    return project


def _delete(pg_url: str, project: str, session: str) -> None:
    with Session(sync_engine(pg_url)) as db:
        deletion.delete_session(db, project, session)
        db.commit()  # the delete has returned


def test_the_feeds_backlog_drops_a_session_deleted_while_it_waited(pg_url: str) -> None:
    project = _sessions(pg_url, 8)
    feed = TrainingFeed(project, "helper", limit=1, settle_s=30)
    with Session(sync_engine(pg_url)) as db:
        handed, _ = feed.poll(db)
        assert [t.session_id for t in handed] == ["s0"] and "s1" in feed.backlog and feed.waiting == 7
        _delete(pg_url, project, "s1")  # the next to be handed out; the feed reads no log while 4 wait
        seen: list[str] = []
        while batch := feed.poll(db)[0]:
            seen += [t.session_id for t in batch]
            db.rollback()
    assert seen == ["s2", "s3", "s4", "s5", "s6", "s7"]


def test_a_batch_handed_out_before_the_delete_is_not_trained_on_after_it(pg_url: str, tmp_path: Path) -> None:
    project = _sessions(pg_url, 4)
    feed = TrainingFeed(project, "helper", limit=4, settle_s=30)

    def load(db: Session, project_id: str, alias: str) -> tuple[list[Trajectory], Counter[str]]:
        batch, excluded = feed(db, project_id, alias)
        if any(t.session_id == "s1" for t in batch):
            _delete(pg_url, project, "s1")  # returns after the poll, before the step
        return batch, excluded

    args = _args(pg_url, project, tmp_path, "http://unused", "--no-deploy", "--steps", "1", "--batch-size", "4")
    assert run(args, loader=load) == 0
    with Session(sync_engine(pg_url)) as db:
        used = set(db.scalars(select(UsedFeedback.trajectory_id).where(UsedFeedback.project_id == project)))
    assert used == {f"{project}-{i}:0" for i in (0, 2, 3)}
