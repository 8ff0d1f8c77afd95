"""The text-feedback feed on the real Postgres: each poll reads only the sessions that changed, a restart resumes."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from sqlalchemy.orm import Session
from transformers import AutoTokenizer

from engine.weights import resolve_model
from storage.changes import load_cursor
from storage.models import Project, TrainingRun, TrainingStep
from storage.text_feedback import mark_feedback_used
from tests.storage.rows import choice, feedback_row, insert, new_project, row
from tests.trainer.test_textual import PROMPT, Q
from trainer.textual import TextualExample
from trainer.textual_load import TextFeed

A1 = {"role": "assistant", "content": "ANSWER: 13"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model("tiny").path)


def _call(db: Session, p: str, session: str, messages: list[dict[str, Any]], **kw: Any) -> str:
    cid = f"cmpl-{uuid.uuid4().hex[:12]}"
    insert(
        db,
        row(cid, PROMPT, [choice([50, 2], content="ANSWER: 13")], messages=messages, project=p, session=session, **kw),
    )
    return cid


def _commented(db: Session, p: str, session: str) -> str:
    cid = _call(db, p, session, [Q])
    db.add(feedback_row(p, "review", comment="Wrong operation.", completion=cid, session=session, source="customer"))
    db.commit()
    return cid


def _train(db: Session, p: str, examples: list[TextualExample]) -> None:
    """What the runner records after a step: each example's (trajectory, feedback item, objective)."""
    run = TrainingRun(project_id=p, alias="agent", objective="sdpo", base_model="tiny")
    db.add(run)
    db.flush()
    step = TrainingStep(run_id=run.id, step=1)
    db.add(step)
    db.flush()
    mark_feedback_used(db, p, "agent", [e.key for e in examples], step.id)
    db.commit()


def _poll(db: Session, feed: TextFeed) -> tuple[list[TextualExample], Counter[str]]:
    out = feed.poll(db)
    db.rollback()
    return out


def sessions(examples: list[TextualExample]) -> list[str]:
    return sorted(e.student.session_id for e in examples)


def test_each_poll_reads_only_what_changed_and_a_restart_resumes_from_the_cursor(db: Session, tokenizer: Any) -> None:
    p = new_project(db)
    first = _commented(db, p, "s1")
    feed = TextFeed(p, "agent", tokenizer, settle_s=30)
    examples, excluded = _poll(db, feed)
    assert (sessions(examples), excluded, feed.sessions_read) == (["s1"], Counter(), 1)
    _train(db, p, examples)

    _commented(db, p, "s2")
    examples, excluded = _poll(db, feed)
    assert (sessions(examples), excluded, feed.sessions_read) == (["s2"], Counter(), 1)  # s1 is not read again
    # The trainer stops before recording s2's example. The cursor it saved at this poll's start is past s1:
    restarted = TextFeed(p, "agent", tokenizer, settle_s=30)
    examples, excluded = _poll(db, restarted)
    assert (sessions(examples), excluded, restarted.sessions_read) == (["s2"], Counter(), 1)
    _train(db, p, examples)
    assert _poll(db, restarted) == ([], Counter()) and restarted.sessions_read == 0
    assert load_cursor(db, p, "text:agent") == restarted.position  # settled: past both sessions
    assert _poll(db, TextFeed(p, "agent", tokenizer, settle_s=30)) == ([], Counter())

    # s1 goes on: the user's next turn says the answer was wrong. Read again; its comment was used already.
    _call(db, p, "s1", [Q, A1, {"role": "user", "content": "No, I gave them away."}], parent=first, at=1)
    db.commit()
    assert _poll(db, restarted) == ([], Counter({"already_used": 1})) and restarted.sessions_read == 1

    # Turning implicit feedback on changes what every session yields: the feed reads the log again.
    project = db.get(Project, p)
    assert project is not None
    project.settings = {"implicit_feedback": True}
    db.commit()
    examples, excluded = _poll(db, restarted)
    assert (sessions(examples), excluded, restarted.sessions_read) == (["s1"], Counter({"already_used": 2}), 2)
    assert [e.hint.kind for e in examples] == ["implicit"]

    # The project names the user's reply's opening as a tool's output (a text protocol's RESULT:): read again, none.
    project.settings = {"implicit_feedback": True, "implicit_feedback_skip": ["No,"]}
    db.commit()
    examples, excluded = _poll(db, restarted)
    assert (examples, restarted.sessions_read) == ([], 2), [e.hint for e in examples]


def test_a_part_weighted_zero_takes_no_place_in_a_batch(db: Session, tokenizer: Any) -> None:
    """Corrections only (``--sdpo-weight 0``): each correction item also gives an SDPO example, which the feed
    leaves out as it reads, so a batch holds corrections alone and none of them waits for a later run."""
    p = new_project(db)
    for s in ("s1", "s2", "s3"):
        cid = _call(db, p, s, [Q])
        db.add(feedback_row(p, "correction", comment="ANSWER: 12", completion=cid, session=s, source="customer"))
    db.commit()
    both = _poll(db, TextFeed(p, "agent", tokenizer, limit=2, settle_s=30))[
        0
    ]  # its one poll saves no cursor past START
    assert sorted(e.objective for e in both) == ["correction", "sdpo"]  # one session's two examples: two a batch
    feed = TextFeed(p, "agent", tokenizer, parts=frozenset({"correction"}), limit=2, settle_s=30)
    examples, excluded = _poll(db, feed)
    assert ([e.objective for e in examples], sessions(examples)) == (["correction"] * 2, ["s1", "s2"])
    assert excluded == Counter({"text_weight_zero": 3})
    _train(db, p, examples)
    examples, excluded = _poll(db, feed)
    assert ([e.objective for e in examples], sessions(examples), excluded) == (["correction"], ["s3"], Counter())
