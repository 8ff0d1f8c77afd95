"""The change log on the real Postgres (and SQLite): every call and feedback item, no transaction skipped."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, insert, select
from sqlalchemy.orm import Session

from storage.changes import (
    START,
    ChangeEntry,
    Position,
    await_horizon,
    changes_since,
    latest_position,
    load_cursor,
    prune_changes,
    save_cursor,
    touched_sessions,
)
from storage.db import sync_engine
from storage.migrate import upgrade
from storage.models import Change, Completion, Feedback
from tests.storage.rows import choice, feedback_row, new_project, row
from tests.storage.rows import insert as insert_rows
from tests.storage.test_feed import Feed, first_call, poll, train


def settled(db: Session, project: str, cursor: Position, n: int) -> list[ChangeEntry]:
    """The entries after ``cursor`` once every committed one is final (the horizon is cluster-wide:
    another test run's transaction in flight holds it back a moment)."""
    assert await_horizon(db, project, timeout_s=30)
    seen = changes_since(db, project, cursor, 100)
    assert len(seen) == n
    return seen


def _call(conn: Connection, project: str, cid: str, session: str) -> None:
    """A call whose id is ``cid`` within ``project`` (completion ids are unique across the shared database)."""
    conn.execute(
        insert(Completion), [row(f"{project}-{cid}", [1, 2], [choice([5, 2])], project=project, session=session)]
    )


def test_a_transaction_that_commits_late_is_never_skipped(pg_url: str, db: Session) -> None:
    """A takes the lower sequence number, B the higher; B commits first. The reader waits for A."""
    project = new_project(db)
    db.commit()
    engine = sync_engine(pg_url)
    try:
        with engine.connect() as a, engine.connect() as b:
            _call(a, project, "cmpl-a", "sa")  # A's transaction is open, holding the lower seq
            _call(b, project, "cmpl-b", "sb")
            b.commit()
            db.rollback()
            # A plain sequence would show B now, and a cursor moved to B's number would skip A for good.
            [b_seq] = db.scalars(select(Change.seq).where(Change.project_id == project))
            assert changes_since(db, project, START, 100) == []  # A is in flight: nothing past it
            cursor = latest_position(db, project)
            assert cursor == START
            a.commit()
        db.rollback()
        seen = settled(db, project, cursor, 2)
        assert [c.ref_id.removeprefix(f"{project}-") for c in seen] == ["cmpl-a", "cmpl-b"]
        assert seen[1].position.seq == b_seq and seen[0].position.seq < b_seq  # A's number is the lower one
        assert changes_since(db, project, seen[-1].position, 100) == []
    finally:
        engine.dispose()


def test_a_transaction_that_started_later_but_took_the_lower_number(pg_url: str, db: Session) -> None:
    """B holds an older transaction id but commits after A's later call: still read, in (xid, seq) order."""
    project = new_project(db)
    db.commit()
    engine = sync_engine(pg_url)
    try:
        with engine.connect() as a, engine.connect() as b:
            _call(b, project, "cmpl-b1", "sb")  # B's transaction id is the older one
            _call(a, project, "cmpl-a", "sa")
            a.commit()
            db.rollback()
            assert changes_since(db, project, START, 100) == []  # B still in flight, older: nothing after it
            _call(b, project, "cmpl-b2", "sb")
            b.commit()
        db.rollback()
        seen = settled(db, project, START, 3)
        assert [c.ref_id.removeprefix(f"{project}-") for c in seen] == ["cmpl-b1", "cmpl-b2", "cmpl-a"]
        # Paging by one never loses an entry.
        cursor, paged = START, []
        while batch := changes_since(db, project, cursor, 1):
            paged += batch
            cursor = batch[-1].position
        assert paged == seen
    finally:
        engine.dispose()


def test_calls_and_every_feedback_revision_are_logged_and_pending_targets_resolved(db: Session) -> None:
    project = new_project(db)
    db.add(Completion(**row(f"{project}-1", [1], [choice([5, 2])], project=project, session="s1")))
    db.flush()
    db.add(feedback_row(project, "thumbs", True, session="s1"))
    db.add(feedback_row(project, "thumbs", False, session="s1"))  # a revision: a new item, a new entry
    db.add(feedback_row(project, "reward", 1.0, pending_target=("completion_id", f"{project}-2")))
    db.commit()
    seen = settled(db, project, START, 4)
    assert [c.kind for c in seen] == ["call", "feedback", "feedback", "feedback"]
    assert touched_sessions(db, project, seen) == {"s1": seen[2].position}  # the pending one names nothing yet
    db.add(Completion(**row(f"{project}-2", [1], [choice([5, 2])], project=project, session="s2")))
    db.commit()
    later = settled(db, project, seen[-1].position, 1)
    assert [c.ref_id for c in later] == [f"{project}-2"]
    # Read again from the start, the pending item now resolves to its landed call's session.
    assert touched_sessions(db, project, seen)["s2"] == seen[3].position
    assert (
        db.scalar(select(Feedback.session_id).where(Feedback.project_id == project, Feedback.name == "reward")) is None
    )


def test_cursors_are_saved_per_consumer(db: Session) -> None:
    project = new_project(db)
    assert load_cursor(db, project, "mine") is None
    save_cursor(db, project, "mine", Position(7, 3))
    db.commit()
    save_cursor(db, project, "mine", Position(9, 1))
    save_cursor(db, project, "train:a", Position(1, 1))
    db.commit()
    assert load_cursor(db, project, "mine") == Position(9, 1) and load_cursor(db, project, "train:a") == Position(1, 1)


def test_sqlite_logs_through_row_triggers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade(url)
    engine = sync_engine(url)
    try:
        with Session(engine) as db:
            project = new_project(db)
            db.add(Completion(**row(f"{project}-1", [1], [choice([5, 2])], project=project, session="s1")))
            db.add(feedback_row(project, "thumbs", True, session="s1"))
            db.commit()
            seen = changes_since(db, project, START, 10)
            assert [(c.kind, c.position.xid) for c in seen] == [("call", 0), ("feedback", 0)]
            assert latest_position(db, project) == seen[-1].position
    finally:
        engine.dispose()


def test_pruning_deletes_what_every_reader_passed_and_a_restarted_reader_misses_nothing(db: Session) -> None:
    p = new_project(db)
    for session in "abcdef":
        insert_rows(db, first_call(p, session))
        db.add(feedback_row(p, "thumbs", True, session=session))
        db.commit()
    log = settled(db, p, START, 12)  # per session: its call, then its grade
    feed = Feed(p, limit=2)
    batch, _ = poll(db, feed)
    train(db, p, batch)
    assert sorted(t.session_id for t in poll(db, feed)[0]) == ["c", "d"]  # handed out, never recorded: it stops
    assert load_cursor(db, p, "train:agent") == log[5].position.before()  # before c's grade: c waited
    save_cursor(db, p, "mine", log[7].position)  # another reader, further on
    db.commit()

    assert prune_changes(db, p, keep_last=0) == 5  # a, b and c's call: below every cursor
    left = changes_since(db, p, START, 100)
    assert left == log[5:]  # what a cursor has not passed stays
    restarted = Feed(p, limit=8)
    batch, _ = poll(db, restarted)
    assert sorted(t.session_id for t in batch) == ["c", "d", "e", "f"]  # everything it had not trained
    train(db, p, batch)
    poll(db, restarted)  # saves its settled cursor: past everything
    save_cursor(db, p, "mine", log[-1].position)
    db.commit()
    assert prune_changes(db, p, keep_last=3) == 4 and changes_since(db, p, START, 100) == log[-3:]  # the window

    unread = new_project(db)  # no reader has a cursor there: nothing goes
    insert_rows(db, first_call(unread, "a"))
    db.commit()
    assert prune_changes(db, unread, keep_last=0) == 0 and len(settled(db, unread, START, 1)) == 1
