"""Text feedback from Postgres: comments, corrections and hindsight per alias, used once per (item, objective)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.orm import Session

from storage.models import TrainingRun, TrainingStep
from storage.text_feedback import load_text_feedback, mark_feedback_used
from tests.storage.rows import choice, feedback_row, insert, new_project, row
from tests.trainer.test_textual import PROMPT, prompt_render, turn_render
from trainer.textual import build_examples, hints

Q = {"role": "user", "content": "I had 9 apples and gave away 4. How many are left?"}
A1 = {"role": "assistant", "content": "ANSWER: 13"}


def _call(db: Session, p: str, session: str, messages: list[dict[str, Any]], reply: str, **kw: Any) -> str:
    cid = f"cmpl-{uuid.uuid4().hex[:12]}"
    insert(db, row(cid, PROMPT, [choice([50, 2], content=reply)], messages=messages, project=p, session=session, **kw))
    return cid


def _step(db: Session, p: str) -> int:
    run = TrainingRun(project_id=p, alias="agent", objective="sdpo", base_model="tiny")
    db.add(run)
    db.flush()
    step = TrainingStep(run_id=run.id, step=1)
    db.add(step)
    db.flush()
    return step.id


@pytest.mark.parametrize("implicit", [False, True])
def test_text_feedback_is_loaded_and_used_once_per_item_and_objective(db: Session, implicit: bool) -> None:
    p = new_project(db, {"implicit_feedback": True} if implicit else {})
    graded = _call(db, p, "graded", [Q], "ANSWER: 13")
    db.add_all(
        [
            feedback_row(p, "reward", 0.0, session="graded", source="harness"),  # trained on numerically already
            feedback_row(p, "review", comment="Wrong operation.", session="graded", source="customer", at=5),
            feedback_row(
                p, "correction", comment="ANSWER: 5", completion=graded, session="graded", source="customer", at=6
            ),
            feedback_row(p, "reward", 0.1, comment="the judge's reasoning", session="graded", source="judge", at=7),
        ]
    )
    t1 = _call(db, p, "chat", [Q], "ANSWER: 13")
    _call(db, p, "chat", [Q, A1, {"role": "user", "content": "No, I gave them away."}], "ANSWER: 5", parent=t1, at=1)
    _call(db, p, "elsewhere", [Q], "x", alias="other")
    db.add(feedback_row(p, "review", comment="other alias", session="elsewhere", source="customer"))
    db.commit()

    loaded = load_text_feedback(db, p, "agent")
    assert sorted(g.name for g in loaded.grades) == ["correction", "review"]
    assert [h.completion_id for h in loaded.hindsight] == ([t1] if implicit else [])
    examples, excluded = build_examples(
        loaded.calls, hints(loaded.calls, loaded.grades, loaded.hindsight), prompt_render, turn_render
    )
    kinds = sorted((e.student.completion_ids[0] == graded, e.objective, e.hint.kind) for e in examples)
    expected = [(True, "correction", "correction"), (True, "sdpo", "comment"), (True, "sdpo", "correction")]
    assert kinds == sorted(expected + ([(False, "sdpo", "implicit")] if implicit else []))
    assert not excluded

    assert mark_feedback_used(db, p, "agent", [e.key for e in examples] * 2, _step(db, p)) == len(examples)
    db.commit()
    again = load_text_feedback(db, p, "agent")
    assert again.used == {e.key for e in examples}
    left, excluded = build_examples(
        again.calls, hints(again.calls, again.grades, again.hindsight), prompt_render, turn_render, used=again.used
    )
    assert left == [] and excluded == {"already_used": len(examples)}
