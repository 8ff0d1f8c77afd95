"""Retention: calls older than a project's ``retention_days`` go with their feedback, flags and change entries.

Sessions left empty go with their session-level feedback; pending feedback that never found
its call goes; lineage (ids) stays; a project without retention is untouched.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from onthejob.cli import main
from proxy.errors import InvalidRequest
from proxy.routes_admin import ProjectIn, _checked
from storage.changes import await_horizon, latest_position, save_cursor
from storage.lineage import version_lineage
from storage.models import Change, Completion, CompletionFlag, Feedback, Project
from storage.models import Session as SessionRow
from storage.retention import apply_retention, retention_days
from tests.proxy.test_deletion import _trained
from tests.storage.rows import T0, choice, feedback_row, insert, new_project, row

DAY = 24 * 3600


def _world(db: Session, project: str) -> None:
    """Session "old": two calls 40 days back; "mixed": one then, one 5 days back; "new": one 5 days back.

    Now is T0 + 40 days.
    """
    insert(
        db,
        row(f"{project}-o1", [1], [choice([5, 2])], session="old", project=project),
        row(f"{project}-o2", [1], [choice([5, 2])], session="old", project=project, parent=f"{project}-o1", at=1),
        row(f"{project}-m1", [1], [choice([5, 2])], session="mixed", project=project, at=2),
        row(
            f"{project}-m2",
            [1],
            [choice([5, 2])],
            session="mixed",
            project=project,
            parent=f"{project}-m1",
            at=35 * DAY,
        ),
        row(f"{project}-n1", [1], [choice([5, 2])], session="new", project=project, at=35 * DAY),
    )
    for session, at in (("old", 1), ("mixed", 35 * DAY), ("new", 35 * DAY)):
        db.add(SessionRow(project_id=project, id=session, created_at=T0, updated_at=T0 + timedelta(seconds=at)))
    db.add_all(
        [
            feedback_row(project, "thumbs", False, session="old", completion=f"{project}-o2"),
            feedback_row(project, "reward", 0.2, session="old"),  # session-level
            feedback_row(project, "thumbs", True, session="mixed", completion=f"{project}-m1"),
            feedback_row(project, "thumbs", True, session="new", completion=f"{project}-n1", at=35 * DAY),
            feedback_row(project, "score", 1, pending_target=("completion_id", "never-landed")),
        ]
    )
    db.add(
        CompletionFlag(
            project_id=project, completion_id=f"{project}-o2", session_id="old", alias="agent", mode="low_grade"
        )
    )
    _trained(db, project, f"{project}-o2:0")
    db.commit()


def test_old_calls_go_with_their_feedback_and_flags_lineage_stays(db: Session) -> None:
    kept, expired = new_project(db), new_project(db, {"retention_days": 30})
    _world(db, kept)
    _world(db, expired)
    done = apply_retention(db, now=T0 + timedelta(days=40), batch=2)  # batches of two: the loops loop
    assert done[expired] == {"calls": 3, "feedback": 4, "sessions": 1}
    assert kept not in done

    calls = set(db.scalars(select(Completion.id).where(Completion.project_id == expired)))
    assert calls == {f"{expired}-m2", f"{expired}-n1"}
    assert set(db.scalars(select(SessionRow.id).where(SessionRow.project_id == expired))) == {"mixed", "new"}
    feedback = db.scalars(select(Feedback.completion_id).where(Feedback.project_id == expired))
    assert list(feedback) == [f"{expired}-n1"]
    assert db.scalar(select(func.count()).select_from(CompletionFlag).where(CompletionFlag.project_id == expired)) == 0
    refs = set(db.scalars(select(Change.ref_id).where(Change.project_id == expired, Change.kind == "call")))
    assert refs == calls  # the change log names no deleted call
    lineage = version_lineage(db, expired, "agent", 1)
    assert lineage is not None and lineage["trajectories"] == [f"{expired}-o2:0"]  # what trained v1 stays named

    assert db.scalar(select(func.count()).select_from(Completion).where(Completion.project_id == kept)) == 5
    assert apply_retention(db, now=T0 + timedelta(days=40))[expired] == {"calls": 0, "feedback": 0, "sessions": 0}


def test_the_setting_is_checked_and_the_cli_runs_one_pass(db: Session, pg_url: str) -> None:
    assert _checked(ProjectIn(retention_days=30)) == {"retention_days": 30}
    assert _checked(ProjectIn(retention_days=None)) == {"retention_days": None}  # keep forever again
    with pytest.raises(ValueError, match="retention_days"):
        ProjectIn(retention_days=0)
    with pytest.raises(InvalidRequest, match="retention_days"):
        _checked(ProjectIn())
    assert [retention_days(s) for s in ({}, {"retention_days": None}, {"retention_days": 7})] == [None, None, 7]

    project = new_project(db, {"retention_days": 1})
    insert(db, row(f"{project}-1", [1], [choice([5, 2])], project=project))  # T0: long before today
    read = new_project(db)  # its one reader has read all three calls: the pass prunes the log but the newest
    insert(db, *(row(f"{read}-{i}", [1], [choice([5, 2])], project=read, session=f"s{i}") for i in range(3)))
    db.commit()
    assert await_horizon(db, read, timeout_s=30)
    save_cursor(db, read, "mine", latest_position(db, read))
    db.commit()
    assert main(["retention", "--db", pg_url, "--keep-changes", "1"]) == 0
    db.expire_all()
    assert db.get(Project, project) is not None
    assert db.scalar(select(func.count()).select_from(Completion).where(Completion.project_id == project)) == 0
    assert list(db.scalars(select(Change.ref_id).where(Change.project_id == read))) == [f"{read}-2"]
