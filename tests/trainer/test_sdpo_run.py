"""``onthejob train --objective sdpo`` end to end: comments and corrections in Postgres become SDPO and SFT."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from transformers import AutoTokenizer

from engine.weights import resolve_model
from storage.db import sync_engine
from storage.keys import ensure_project
from storage.models import UsedFeedback
from tests.storage.rows import choice, feedback_row, insert, row
from tests.trainer.test_runner import Pool, _args, _rows
from trainer.runner import run

Q = {"role": "user", "content": "I had 9 apples and gave away 4. How many are left?"}


@pytest.fixture
def project(pg_url: str) -> str:
    engine = sync_engine(pg_url)
    name = f"p-{uuid.uuid4().hex[:8]}"
    with Session(engine) as db:
        ensure_project(db, name)
        db.commit()
    engine.dispose()
    return name


def _seed(pg_url: str, project: str) -> None:
    tokenizer: Any = AutoTokenizer.from_pretrained(resolve_model("tiny").path)
    prompt = list(tokenizer.apply_chat_template([Q], add_generation_prompt=True, tokenize=True)["input_ids"])
    engine = sync_engine(pg_url)
    with Session(engine) as db:
        insert(
            db,
            row(
                "c-sdpo-1",
                prompt,
                [choice([50, 51, 2], content="ANSWER: 13")],
                messages=[Q],
                project=project,
                session="s1",
                alias="helper",
            ),
        )
        db.add_all(
            [
                feedback_row(project, "review", comment="Wrong operation.", session="s1", source="customer"),
                feedback_row(
                    project,
                    "correction",
                    comment="ANSWER: 5",
                    completion="c-sdpo-1",
                    session="s1",
                    source="customer",
                    at=1,
                ),
            ]
        )
        db.commit()
    engine.dispose()


def test_text_feedback_trains_once_per_item_and_objective(
    pg_url: str,
    project: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    _seed(pg_url, project)
    args = _args(pg_url, project, tmp_path, "http://unused", "--no-deploy", "--objective", "sdpo")
    assert run(args, loader=Pool([])) == 0  # no scored traffic at all: text feedback alone makes the step
    runs, steps, adapters, _ = _rows(pg_url, project)
    (step,) = steps
    m = step.metrics
    assert (m["sdpo_tokens"], m["tokens"]) == (6, 0)  # two SDPO examples of the 3 logged tokens; no scored part
    assert m["correction_tokens"] > 0 and m["sdpo_loss"] is not None and m["correction_loss"] > 0
    assert m["loss"] is None and [a.version for a in adapters] == [1]
    assert runs[0].objective == "sdpo"
    err = capsys.readouterr().err
    assert "judge: none configured" in err

    engine = sync_engine(pg_url)
    with Session(engine) as db:
        used = sorted(
            db.execute(
                select(UsedFeedback.objective, UsedFeedback.trajectory_id).where(UsedFeedback.project_id == project)
            ).all()
        )
    engine.dispose()
    assert used == [("correction", "c-sdpo-1:0"), ("sdpo", "c-sdpo-1:0"), ("sdpo", "c-sdpo-1:0")]

    assert run(args, loader=Pool([])) == 0  # used once: nothing left
    assert "no graded trajectories to train on for 'helper' (excluded: already_used=3, ungraded=2)" in (
        capsys.readouterr().err
    )
