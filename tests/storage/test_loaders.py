"""Loaders against the real Postgres: the trainer's batch, exclusions by reason, grading coverage."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from sqlalchemy.orm import Session

from storage.loaders import load_training_batch, load_trajectories, ungraded_share
from storage.models import TrainingRun, TrainingStep, UsedFeedback
from tests.storage.rows import choice, feedback_row, insert, new_project, row
from tests.storage.test_trajectories import P1


def call(project: str, session: str, **kw: Any) -> dict[str, Any]:
    ids = kw.pop("ids", [50, 2])
    return row(
        f"cmpl-{uuid.uuid4().hex[:12]}", kw.pop("prompt", P1), [choice(ids)], project=project, session=session, **kw
    )


def mark_used(db: Session, project: str, trajectory_id: str) -> None:
    run = TrainingRun(project_id=project, alias="agent", objective="tis", base_model="tiny")
    db.add(run)
    db.flush()
    step = TrainingStep(run_id=run.id, step=1)
    db.add(step)
    db.flush()
    db.add(
        UsedFeedback(
            project_id=project,
            alias="agent",
            trajectory_id=trajectory_id,
            feedback_id="*",
            objective="reward",
            step_id=step.id,
        )
    )


def test_training_batch_takes_graded_unused_trajectories_and_counts_every_exclusion(db: Session) -> None:
    p = new_project(db)
    names = ("good", "pend", "used", "infra", "silent")
    good, pend, used, infra, silent = (insert(db, call(p, s, adapter=2)) for s in names)
    insert(
        db,
        call(p, "eval", tags=["eval"]),
        call(p, "timed", termination="timeout"),
        call(p, "broken", prompt=None),
        call(p, "other", alias="someone-else"),
    )
    db.add_all(
        [
            feedback_row(p, "thumbs", True, session="good"),
            feedback_row(p, "reward", 0.5, pending_target=("completion_id", pend[0].id)),  # not attached yet: counts
            feedback_row(p, "thumbs", True, session="used"),
            feedback_row(p, "thumbs", True, session="eval"),
            feedback_row(p, "outcome", "infra_error", completion=infra[0].id, session="infra"),
            feedback_row(p, "review", None, comment="no score", session="silent"),
            feedback_row(p, "thumbs", True, session="broken"),
            feedback_row(p, "thumbs", True, session="other"),
        ]
    )
    mark_used(db, p, f"{used[0].id}:0")
    db.commit()

    batch, excluded = load_training_batch(db, p, "agent")
    assert {(t.session_id, t.reward) for t in batch} == {("good", 1.0), ("pend", 0.5), ("timed", 0.0)}
    assert excluded == Counter({"already_used": 1, "eval": 1, "infra_error": 1, "ungraded": 1, "missing_token_ids": 1})
    [good_t] = [t for t in batch if t.session_id == "good"]
    assert good_t.adapters == [2] and good_t.reward_detail["scope"] == "session"
    assert load_training_batch(db, p, "nobody") == ([], Counter())


def test_project_settings_choose_the_reward_rule(db: Session) -> None:
    p = new_project(db, settings={"reward": {"labels": {"outcome": {"partial": 0.5}}}})
    insert(db, call(p, "s"))
    db.add(feedback_row(p, "outcome", "partial", session="s"))
    db.commit()
    [t] = load_trajectories(db, p, session_ids=["s"])
    assert (t.reward, t.reward_detail["rule"]) == (0.5, "custom")


def test_ungraded_share_per_adapter_version(db: Session) -> None:
    p = new_project(db)
    # v1: 3 sessions, 1 graded; v2: 1 session, graded by a pending item; base: 1 session, comment only.
    for s in ("a", "b", "c"):
        insert(db, call(p, s, adapter=1))
    insert(db, call(p, "d", adapter=1, at=0), call(p, "d", adapter=2, at=5))
    base = insert(db, call(p, "e"))
    db.add_all(
        [
            feedback_row(p, "outcome", "success", session="a"),
            feedback_row(p, "thumbs", False, pending_target=("session_id", "d")),
            feedback_row(p, "review", None, comment="hmm", completion=base[0].id, session="e"),
        ]
    )
    db.commit()
    assert ungraded_share(db, p) == {
        1: {"sessions": 3, "ungraded": 2, "share": 2 / 3},
        2: {"sessions": 1, "ungraded": 0, "share": 0.0},
        None: {"sessions": 1, "ungraded": 1, "share": 1.0},
    }
    assert ungraded_share(db, p, alias="someone-else") == {}
