"""Judge grades in the reward rule: never above a harness or human grade, and only while calibrated."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session

from storage.grading import DEFAULT_RULE, Exclusion, resolve_reward, to_grade, training_exclusion
from storage.judge_config import JudgeSettings
from storage.judge_store import record_calibration
from storage.loaders import load_training_batch
from tests.storage.rows import choice, feedback_row, insert, new_project, row
from tests.storage.test_trajectories import P1
from tests.trainer.helpers import make_trajectory

ACCEPTED = replace(DEFAULT_RULE, judge_accepted=True)
JUDGE = {"rubric": "Correct and brief.", "scale": [0, 1], "min_labelled": 2}


def _traj(**kw: Any) -> Any:
    t = make_trajectory("t1", [1, 2, 3], [4, 5], reward=None, **kw)
    t.session_id = "s1"
    return t


def _fb(name: str, value: Any, source: str, at: int, **kw: Any) -> Any:
    return to_grade(feedback_row("p", name, value, session="s1", source=source, at=at, **kw))


def test_a_judge_grade_after_a_harness_grade_changes_nothing() -> None:
    harness = _fb("outcome", "failure", "harness", at=1)
    judge = _fb("reward", 1.0, "judge", at=99)  # newer, and "reward" outranks "outcome" by name
    for rule in (DEFAULT_RULE, ACCEPTED):
        assert resolve_reward(_traj(), [harness], rule)[0] == 0.0
        reward, detail = resolve_reward(_traj(), [harness, judge], rule)
        assert (reward, detail["source"], detail["feedback_id"]) == (0.0, "harness", harness.id)
    # on a call of the trajectory too: the harness's per-call grade beats the judge's session grade
    call = to_grade(feedback_row("p", "thumbs", False, completion="cmpl-t1", source="customer", at=2))
    assert resolve_reward(_traj(), [call, judge], ACCEPTED)[0] == -1.0


def test_a_judge_grade_alone_counts_only_while_calibrated() -> None:
    judge = _fb("reward", 0.75, "judge", at=5)
    reward, detail = resolve_reward(_traj(), [judge], DEFAULT_RULE)
    assert reward is None and detail["excluded"] == Exclusion.JUDGE_UNCALIBRATED
    assert resolve_reward(_traj(), [judge], ACCEPTED)[0] == 0.75


def test_a_judge_never_rescues_a_failure_the_proxy_saw() -> None:
    t = _traj()
    t.flags = ["timeout"]
    judge = to_grade(feedback_row("p", "reward", 1.0, completion="cmpl-t1", source="judge", at=5))
    reward, detail = resolve_reward(t, [judge], ACCEPTED)
    assert (reward, detail["termination"]) == (0.0, "timeout")


def test_the_judges_own_calls_are_never_trained_on() -> None:
    assert training_exclusion(make_trajectory("j", [1, 2], [3], tags=["judge"]), set()) == Exclusion.JUDGE_CALL


def _call(db: Session, p: str, session: str) -> None:
    insert(db, row(f"cmpl-{uuid.uuid4().hex[:12]}", P1, [choice([50, 2])], project=p, session=session))


def test_training_batch_with_judge_grades(db: Session) -> None:
    p = new_project(db, {"judge": JUDGE})
    _call(db, p, "graded")
    _call(db, p, "judged")
    db.add(feedback_row(p, "reward", 0.2, session="graded", source="harness", at=1))
    db.commit()
    before = {t.session_id: t.reward for t in load_training_batch(db, p, "agent")[0]}
    db.add_all(
        [
            feedback_row(p, "reward", 0.9, session="graded", source="judge", at=50),
            feedback_row(p, "reward", 0.8, session="judged", source="judge", at=51),
        ]
    )
    db.commit()
    batch, excluded = load_training_batch(db, p, "agent")
    assert {t.session_id: t.reward for t in batch} == before == {"graded": 0.2}  # the late judge changed nothing
    assert excluded[Exclusion.JUDGE_UNCALIBRATED] == 1  # never calibrated: its grade is counted, not used

    record_calibration(
        db, p, JudgeSettings.model_validate(JUDGE), n=3, unreadable=0, spearman=0.3, accuracy=0.6, threshold=0.5
    )
    db.commit()
    assert load_training_batch(db, p, "agent")[1][Exclusion.JUDGE_UNCALIBRATED] == 1  # rho 0.3 < 0.6
    record_calibration(
        db, p, JudgeSettings.model_validate(JUDGE), n=3, unreadable=0, spearman=0.9, accuracy=1.0, threshold=0.5
    )
    db.commit()
    batch, excluded = load_training_batch(db, p, "agent")
    assert {t.session_id: t.reward for t in batch} == {"graded": 0.2, "judged": 0.8}
    assert Exclusion.JUDGE_UNCALIBRATED not in excluded
