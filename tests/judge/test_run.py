"""One judge pass end to end: Postgres rows in, a scripted judge over HTTP, grades posted through the real proxy."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from judge.client import JudgeClient
from judge.post import post_feedback
from judge.run import judge_once
from storage.judge_store import judge_state
from storage.models import Feedback, JudgeCalibration
from tests.judge.scripted import RIGHT, scripted_judge
from tests.proxy.conftest import ProxyFactory, make_key
from tests.storage.rows import choice, feedback_row, insert, new_project, row
from tests.storage.test_trajectories import P1

pytestmark = pytest.mark.anyio

JUDGE = {
    "rubric": "Right answer on an 'ANSWER: N' line, briefly.",
    "scale": [0, 100],
    "min_labelled": 4,
    "self_evaluation": True,
}
QUESTION = [{"role": "user", "content": "A box holds 3 rows of 4 eggs. How many eggs?"}]


def _session(db: Session, project: str, name: str, answer: str, **kw: Any) -> str:
    cid = f"cmpl-{uuid.uuid4().hex[:12]}"
    insert(
        db,
        row(
            cid,
            P1,
            [choice([50, 2], content=answer)],
            messages=QUESTION,
            project=project,
            session=name,
            task="eggs",
            **kw,
        ),
    )
    return cid


def _seed(db: Session) -> str:
    p = new_project(db, {"judge": JUDGE})
    for i in range(6):  # held-out, graded by the harness: the calibration set
        good = i % 2 == 0
        _session(db, p, f"eval-{i}", RIGHT if good else "ANSWER: 7", tags=["eval"])
        db.add(feedback_row(p, "reward", 100 if good else 0, session=f"eval-{i}", source="harness"))
    _session(db, p, "commented", RIGHT)
    db.add(feedback_row(p, "review", comment="Right, and nicely short.", session="commented", source="customer"))
    _session(db, p, "silent", "ANSWER: 7")  # nobody graded it: self-evaluation
    _session(db, p, "graded", "ANSWER: 7")
    db.add(feedback_row(p, "reward", 0, session="graded", source="harness"))
    _session(db, p, "the-judge-itself", "Score: 9", tags=["judge"])
    db.commit()
    return p


async def test_a_pass_calibrates_judges_and_posts_through_the_proxy(
    db: Session, pg_url: str, stub_upstream: str, start_proxy: ProxyFactory
) -> None:
    p = _seed(db)
    proxy = start_proxy(stub_upstream, pg_url, auth=True)
    key = make_key(pg_url, project=p)

    async def post(items: Sequence[dict[str, Any]]) -> int:
        return await post_feedback(proxy.url, key, items)

    async with scripted_judge() as judge, JudgeClient(judge.url, "smol") as client:
        report = await judge_once(db, p, client, post)
        again = await judge_once(db, p, client, post, calibrate_first=False)

    assert report.agreement is not None and report.verdict is not None
    assert (report.agreement.n, report.agreement.spearman, report.verdict.accepted) == (6, 1.0, True)
    assert (report.judged, report.posted) == (2, 2)
    assert report.skipped == {"graded": 7, "judge_call": 1}
    assert (again.judged, again.posted, again.skipped["already_judged"]) == (0, 0, 2)

    db.expire_all()
    rows = {
        f.session_id: f
        for f in db.scalars(select(Feedback).where(Feedback.project_id == p, Feedback.source == "judge"))
    }
    assert set(rows) == {"commented", "silent"}
    assert (rows["commented"].name, rows["commented"].value) == ("reward", 90.0)
    assert rows["commented"].comment == "The last answer matches the task."  # the reasoning, not the score line
    assert rows["silent"].value == 10.0 and rows["silent"].attached_at is not None
    assert db.scalar(select(JudgeCalibration.spearman).where(JudgeCalibration.project_id == p)) == 1.0
    state = judge_state(db, p)
    assert state.verdict.accepted and state.to_dict()["calibration"]["n"] == 6


async def test_the_command_reads_its_endpoint_from_settings_and_hindsight_stands_in_for_a_comment(
    db: Session, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from judge.main import JudgeCommand, client_for, judge_model, one_pass
    from storage.judge_config import JudgeSettings

    async with scripted_judge() as judge:
        settings = {
            "judge": {
                **JUDGE,
                "base_url": judge.url,
                "api_key_env": "TEST_JUDGE_KEY",
                "model": "big-judge",
                "self_evaluation": False,
            },
            "implicit_feedback": True,
        }
        p = new_project(db, settings)
        first = _session(db, p, "chat", "ANSWER: 7")
        insert(
            db,
            row(
                f"cmpl-{uuid.uuid4().hex[:12]}",
                P1,
                [choice([50, 2], content=RIGHT)],
                project=p,
                session="chat",
                parent=first,
                at=1,
                messages=[
                    *QUESTION,
                    {"role": "assistant", "content": "ANSWER: 7"},
                    {"role": "user", "content": "No, count again."},
                ],
            ),
        )
        _session(db, p, "silent", "ANSWER: 7")
        db.commit()
        monkeypatch.setenv("TEST_JUDGE_KEY", "secret-judge-key")
        report = await one_pass(JudgeCommand(db_url=pg_url, project=p, dry_run=True), db)

    assert (report.judged, report.posted, report.skipped["self_evaluation_off"]) == (1, 0, 1)  # dry run: nothing posted
    headers, body = judge.requests[-1]
    assert headers["Authorization"] == "Bearer secret-judge-key" and body["model"] == "big-judge"
    assert "No, count again." in body["messages"][1]["content"]  # the next user turn, read as the comment
    assert "reaction" in body["messages"][0]["content"]  # the rubric clause for implicit feedback
    cfg = JudgeSettings.model_validate({"rubric": "r"})
    assert judge_model(db, p, cfg, "agent") == "agent"
    default = client_for(JudgeCommand(db_url=pg_url, proxy="http://proxy:8000", api_key="k"), cfg, "agent")
    assert (default.base_url, default.api_key) == ("http://proxy:8000/v1", "k")  # through the proxy, tagged judge


def test_no_judge_configured_is_a_clear_exit(db: Session, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from judge.main import JudgeCommand, run

    p = new_project(db)
    db.commit()
    assert run(JudgeCommand(db_url=pg_url, project=p)) == 2
    assert f"project {p!r} has no judge: PUT /v1/admin/project" in capsys.readouterr().err
