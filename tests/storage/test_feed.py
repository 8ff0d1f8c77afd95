"""The trainer's incremental feed on the real Postgres: what changed, once; grown sessions; revised grades."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from sqlalchemy.orm import Session

from storage.feed import TrainingFeed
from storage.models import TrainingRun, TrainingStep
from storage.trajectories import Trajectory
from storage.used import mark_used, reward_key
from tests.storage.rows import choice, feedback_row, insert, new_project, row
from tests.storage.test_trajectories import AFTER, P1, TOOL, USER


def _step(db: Session, project: str) -> int:
    run = TrainingRun(project_id=project, alias="agent", objective="tis", base_model="tiny")
    db.add(run)
    db.flush()
    step = TrainingStep(run_id=run.id, step=1)
    db.add(step)
    db.flush()
    return step.id


def train(db: Session, project: str, batch: list[Trajectory]) -> None:
    """What the runner records after a step: each trajectory used with its reward's feedback."""
    mark_used(db, project, "agent", [k for t in batch if (k := reward_key(t)) is not None], _step(db, project))
    db.commit()


def Feed(project: str, **kw: Any) -> TrainingFeed:  # noqa: N802 - reads as the class it builds
    """A feed that waits long for the horizon: another test run's open transaction may hold it back."""
    return TrainingFeed(project, "agent", settle_s=30, **kw)


def poll(db: Session, feed: TrainingFeed) -> tuple[list[Trajectory], Counter[str]]:
    out = feed(db, feed.project, "agent")
    db.rollback()
    return out


def first_call(p: str, session: str, **kw: Any) -> dict[str, Any]:
    return row(f"{p}-{uuid.uuid4().hex[:8]}", P1, [choice([50, 51, 2])], project=p, session=session, **kw)


def next_call(p: str, parent: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """A call continuing ``parent`` (its sampled ids re-rendered exactly, then a tool result)."""
    prompt = parent["prompt_token_ids"] + parent["choices"][0]["token_ids"] + AFTER
    reply = {"role": "assistant", "content": "x"}
    return row(
        f"{p}-{uuid.uuid4().hex[:8]}",
        prompt,
        [choice([52, 2])],
        project=p,
        session=parent["session_id"],
        messages=[USER, reply, TOOL],
        parent=parent["id"],
        at=1,
        **kw,
    )


def test_each_change_is_read_once_and_ungraded_or_eval_sessions_are_not_rebuilt(db: Session) -> None:
    p = new_project(db)
    insert(db, first_call(p, "good"), first_call(p, "silent"), first_call(p, "held", tags=["eval"]))
    db.add_all([feedback_row(p, "thumbs", True, session="good"), feedback_row(p, "thumbs", True, session="held")])
    db.commit()
    feed = Feed(p, limit=8)
    batch, excluded = poll(db, feed)
    assert [t.session_id for t in batch] == ["good"] and excluded == Counter({"ungraded": 1, "eval": 1})
    train(db, p, batch)
    assert poll(db, feed) == ([], Counter())  # nothing changed: nothing rebuilt, nothing counted
    db.add(feedback_row(p, "review", None, comment="fine", session="silent"))  # a comment: no scalar
    db.commit()
    assert poll(db, feed) == ([], Counter({"ungraded": 1}))  # only the session that changed is read


def test_a_grown_session_trains_only_its_new_turns_and_a_revised_grade_trains_it_all_again(db: Session) -> None:
    p = new_project(db)
    c1 = first_call(p, "s")
    insert(db, c1)
    db.add(feedback_row(p, "outcome", "success", session="s"))
    db.commit()
    feed = Feed(p, limit=8)
    [t1], _ = poll(db, feed)
    assert t1.mask == [0] * 9 + [1] * 3
    train(db, p, [t1])

    c2 = next_call(p, c1)
    insert(db, c2)
    db.commit()
    [t2], _ = poll(db, feed)  # the longer branch, a new id; its first turn was trained on this grade
    assert t2.id == f"{c2['id']}:0" and t2.reward == 1.0
    assert t2.mask == [0] * 9 + [0] * 3 + [0] * 10 + [1] * 2  # only the new turn is trained
    assert t2.reward_detail["trained_prefix"] == t1.id
    train(db, p, [t2])

    db.add(feedback_row(p, "review", None, comment="late comment", session="s"))  # new item, same reward
    db.commit()
    assert poll(db, feed) == ([], Counter({"already_used": 1}))  # never twice for the same feedback

    db.add(feedback_row(p, "outcome", "failure", session="s", at=5))  # a revision: a new feedback item
    db.commit()
    [t3], _ = poll(db, feed)
    assert (t3.id, t3.reward) == (t2.id, 0.0) and t3.mask == [0] * 9 + [1] * 3 + [0] * 10 + [1] * 2


def test_a_restarted_feed_resumes_from_its_cursor_and_re_reads_only_what_waited(db: Session) -> None:
    p = new_project(db)
    insert(db, first_call(p, "a", at=0), first_call(p, "b", at=1))
    db.add_all([feedback_row(p, "thumbs", True, session="a"), feedback_row(p, "thumbs", False, session="b")])
    db.commit()
    feed = Feed(p, limit=1)
    [ta], _ = poll(db, feed)
    train(db, p, [ta])
    restarted = Feed(p, limit=1)
    [tb], _ = poll(db, restarted)  # "b" waited in the old feed's backlog: the saved cursor is before it
    assert {ta.session_id, tb.session_id} == {"a", "b"}
    train(db, p, [tb])
    assert poll(db, restarted) == ([], Counter())  # saves its settled cursor: past both
    assert poll(db, Feed(p, limit=1)) == ([], Counter())
    assert feed.waiting == 1 and restarted.waiting == 0


def test_feedback_that_waited_for_its_call_is_seen_when_the_call_lands(db: Session) -> None:
    p = new_project(db)
    c = first_call(p, "late")
    db.add(feedback_row(p, "reward", 0.5, pending_target=("completion_id", c["id"])))
    db.commit()
    feed = Feed(p, limit=4)
    assert poll(db, feed) == ([], Counter())
    insert(db, c)
    db.commit()
    [t], _ = poll(db, feed)
    assert (t.session_id, t.reward) == ("late", 0.5)


def test_min_batch_holds_trajectories_back_until_enough_wait(db: Session) -> None:
    p = new_project(db)
    insert(db, first_call(p, "a"))
    db.add(feedback_row(p, "thumbs", True, session="a"))
    db.commit()
    feed = Feed(p, limit=4, min_batch=2)
    assert poll(db, feed)[0] == [] and feed.waiting == 1
    insert(db, first_call(p, "b"))
    db.add(feedback_row(p, "thumbs", True, session="b"))
    db.commit()
    assert sorted(t.session_id for t in poll(db, feed)[0]) == ["a", "b"]
