"""Datasets on the real Postgres: selection, pinning, immutability, diff, deletion, export and ``train --dataset``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from onthejob.cli import build_parser, main
from onthejob.commands import train_settings
from storage import datasets
from storage.dataset_load import DatasetFeed, pinned
from storage.dataset_select import Candidate, curate, judge_agrees
from storage.datasets import DatasetError, DatasetExists, DatasetFilter, Spec
from storage.deletion import delete_session
from storage.lineage import learned_from, version_lineage
from storage.mine_store import mine
from storage.models import DatasetItem, TrainingRun, TrainingStep
from tests.storage.rows import GEN, choice, feedback_row, insert, msg, new_project, row
from tests.trainer.helpers import make_trajectory
from trainer.runner import run

# session -> (task, finish reason, grade): "length" is what onthejob mine flags "truncated".
WORLD: dict[str, tuple[str, str, tuple[str, Any] | None]] = {
    "t1-a": ("t1", "length", ("outcome", "failure")),
    "t1-b": ("t1", "stop", ("outcome", "success")),
    "t1-c": ("t1", "stop", ("reward", 0.8)),
    "t1-d": ("t1", "stop", ("reward", 0.6)),
    "t1-e": ("t1", "length", ("reward", 0.3)),
    "t2-a": ("t2", "stop", ("reward", 0.2)),
    "t2-b": ("t2", "stop", ("reward", 0.9)),
    "t3-a": ("t3", "length", None),
}


def _world(db: Session) -> tuple[str, dict[str, str]]:
    """A project with the sessions of WORLD (alias agent) and one of alias "other"; mined. Returns feedback ids."""
    p = new_project(db)
    sessions = {**WORLD, "o-a": ("t9", "stop", ("reward", 1.0))}
    grades: dict[str, str] = {}
    for i, (session, (task, finish, grade)) in enumerate(sessions.items()):
        reply = choice([50 + i, 51, 2], finish=finish, content="ok", logprobs=None)
        insert(
            db,
            row(
                f"{p}-{session}",
                msg("user", 40 + i) + GEN,
                [reply],
                session=session,
                project=p,
                task=task,
                at=i,
                alias="other" if session == "o-a" else "agent",
            ),
        )
        if grade is not None:
            fb = feedback_row(p, grade[0], grade[1], session=session, at=i)
            db.add(fb)
            grades[session] = fb.id
    db.commit()
    assert mine(db, p).calls == len(sessions)  # waits for the cluster's older transactions (other databases' too)
    return p, grades


def _sessions(out: dict[str, Any], key: str = "items") -> list[str]:
    return sorted(i["session_id"] for i in out[key])


# --------------------------------------------------------------------------- pure


def test_a_filter_refuses_what_it_does_not_know_by_name() -> None:
    with pytest.raises(DatasetError, match="filter.colour is not a filter"):
        DatasetFilter.from_dict({"colour": "red"})
    with pytest.raises(DatasetError, match="filter.flags: 'slow' is not a failure mode"):
        DatasetFilter.from_dict({"flags": "timeout,slow"})
    with pytest.raises(DatasetError, match="filter.min_reward: 'x' is not a number"):
        DatasetFilter.from_dict({"min_reward": "x"})
    with pytest.raises(DatasetError, match="from_mine: 'nope'"):
        Spec(from_mine="nope")
    f = DatasetFilter.from_dict({"flags": "timeout, truncated", "since": "2026-01-01T00:00", "alias": "a"})
    assert f.to_dict() == {"alias": "a", "since": "2026-01-01T00:00:00+00:00", "flags": ["timeout", "truncated"]}


def test_judge_agreement_reads_the_rule_candidates() -> None:
    def detail(*pairs: tuple[str, float]) -> dict[str, Any]:
        return {"candidates": [{"source": source, "scalar": scalar} for source, scalar in pairs]}

    assert judge_agrees(detail(("judge", 0.9), ("harness", 1.0)), 0.5) is True
    assert judge_agrees(detail(("judge", 0.9), ("harness", 0.0)), 0.5) is False
    assert judge_agrees(detail(("harness", 1.0)), 0.5) is None


def test_curate_keeps_failures_and_the_best_successes_of_their_tasks() -> None:
    def cand(tid: str, task: str, reward: float | None, *modes: str) -> Candidate:
        return Candidate(make_trajectory(tid, [1], [2, 3], reward=reward, task=task), None, (), frozenset(modes))

    pool = [
        cand("f1", "a", 0.0),
        cand("f2", "b", None, "timeout"),
        cand("s1", "a", 0.7),
        cand("s2", "a", 1.0),
        cand("s3", "a", 0.9),
        cand("s4", "c", 1.0),
        cand("s5", "a", 1.0, "long_answer"),
    ]
    picked = [(c.traj.id, role) for c, role in curate(pool, (), 0.5, per_task=2)]
    # s5 is flagged: a failure, not a success; task c has no failure; task b no success.
    assert picked == [("f1", "failure"), ("f2", "failure"), ("s5", "failure"), ("s2", "success"), ("s3", "success")]
    assert [c.traj.id for c, _ in curate(pool, ("timeout",), 0.5, per_task=1)] == ["f2"]


# --------------------------------------------------------------------------- the database


def test_create_pins_and_a_name_is_taken_once(db: Session) -> None:
    p, grades = _world(db)
    out = datasets.create(db, p, "good", Spec(DatasetFilter(alias="agent", min_reward=0.5)), "the good ones")
    db.commit()
    assert out["counts"] == {"trajectories": 4, "sessions": 4, "graded": 4, "feedback": 4}
    shown = datasets.show(db, p, "good")
    assert _sessions(shown) == ["t1-b", "t1-c", "t1-d", "t2-b"]
    item = next(i for i in shown["items"] if i["session_id"] == "t1-c")
    assert item["completion_ids"] == [f"{p}-t1-c"] and item["reward"] == 0.8
    assert item["reward_feedback_id"] == grades["t1-c"]
    assert [(f["id"], f["name"], f["value"]) for f in item["feedback"]] == [(grades["t1-c"], "reward", 0.8)]
    with pytest.raises(DatasetExists, match="'good' exists"):
        datasets.create(db, p, "good", Spec())
    mined = datasets.create(db, p, "cut", Spec(from_mine="truncated"))
    assert mined["filter"] == {"kind": "mine", "filter": {}, "from_mine": "truncated"}
    assert _sessions(datasets.show(db, p, "cut")) == ["t1-a", "t1-e", "t3-a"]
    curated = datasets.create(db, p, "cur", Spec(DatasetFilter(alias="agent"), curated=True, per_task=2))
    assert curated["counts"]["roles"] == {"failure": 4, "success": 3}  # t2-a: graded low (and flagged low_grade)
    roles = {i["session_id"]: i["role"] for i in datasets.show(db, p, "cur")["items"]}
    assert roles == {
        "t1-a": "failure",
        "t1-e": "failure",
        "t2-a": "failure",
        "t3-a": "failure",
        "t1-b": "success",
        "t1-c": "success",
        "t2-b": "success",
    }
    # Read two sessions a page: the same items, the curated ones too (successes kept across pages).
    datasets.create(db, p, "cur-paged", Spec(DatasetFilter(alias="agent"), curated=True, per_task=2), page=2)
    assert datasets.diff(db, p, "cur", "cur-paged")["same"] == 7
    assert [d["name"] for d in datasets.list_datasets(db, p)] == ["good", "cut", "cur", "cur-paged"]


def test_pinned_values_survive_revisions_and_diff_shows_them(
    db: Session, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p, grades = _world(db)
    datasets.create(db, p, "before", Spec(DatasetFilter(alias="agent")))
    db.add(feedback_row(p, "reward", 0.2, session="t1-d", at=100))  # a revision: newer, same (source, name)
    insert(
        db,
        row(
            f"{p}-new", msg("user", 90) + GEN, [choice([91, 2], content="ok", logprobs=None)], session="new", project=p
        ),
    )
    db.commit()
    datasets.create(db, p, "after", Spec(DatasetFilter(alias="agent")))
    db.commit()
    d = datasets.diff(db, p, "before", "after")
    assert (d["only_a"], _sessions(d, "only_b"), d["same"]) == ([], ["new"], 7)
    assert [(c["trajectory_id"], c["a"]["reward"], c["b"]["reward"]) for c in d["changed"]] == [
        (f"{p}-t1-d:0", 0.6, 0.2)
    ]
    _, trajectories, left_out = pinned(db, p, "before")
    by_session = {t.session_id: t for t in trajectories}
    assert by_session["t1-d"].reward == 0.6 and by_session["t1-d"].reward_detail["feedback_id"] == grades["t1-d"]
    assert not left_out and len(trajectories) == 8
    out = tmp_path / "rl.jsonl"
    assert (
        main(["export", "--format", "rl", "--dataset", "before", "--project", p, "--db", pg_url, "-o", str(out)]) == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["session_id"]: r["reward"] for r in rows}["t1-d"] == 0.6 and len(rows) == 7  # t3-a is ungraded
    capsys.readouterr()
    where = ["--project", p, "--db", pg_url]
    assert main(["dataset", "diff", "before", "after", *where]) == 0
    assert "only in before: 0, only in after: 1, changed: 1, same: 7" in capsys.readouterr().out
    assert main(["dataset", "list", *where]) == 0
    assert "before  " in capsys.readouterr().out
    assert main(["dataset", "create", "before", *where]) == 2
    assert "dataset 'before' exists in this project" in capsys.readouterr().err
    assert main(["dataset", "show", "nope", *where]) == 2
    assert main(["dataset", "create", "x", "--filter", "colour=red", *where]) == 2
    assert "filter.colour is not a filter" in capsys.readouterr().err


def test_a_deleted_session_vanishes_from_show_export_and_training(db: Session) -> None:
    p, _ = _world(db)
    datasets.create(db, p, "all", Spec(DatasetFilter(alias="agent")))
    db.commit()
    delete_session(db, p, "t1-b")
    db.commit()
    shown = datasets.show(db, p, "all")
    assert "t1-b" not in _sessions(shown) and shown["counts"]["trajectories"] == 7 and shown["removed"] == 1
    assert [d["counts"]["trajectories"] for d in datasets.list_datasets(db, p)] == [7]
    _, trajectories, _ = pinned(db, p, "all")
    assert "t1-b" not in {t.session_id for t in trajectories}
    batch, excluded = DatasetFeed(p, "agent", "all", limit=100)(db, p, "agent")
    assert sorted(t.session_id for t in batch) == ["t1-a", "t1-c", "t1-d", "t1-e", "t2-a", "t2-b"]
    assert excluded == {"ungraded": 1}
    assert not db.scalars(
        select(DatasetItem).where(DatasetItem.project_id == p, DatasetItem.session_id == "t1-b")
    ).all()
    assert datasets.show(db, p, "all")["removed"] == 1


def test_a_mined_dataset_trains_and_its_lineage_lists_exactly_it(db: Session, pg_url: str, tmp_path: Path) -> None:
    """``train --dataset``: the pinned items with the pinned rewards, even after a revision; lineage names them."""
    p, grades = _world(db)
    assert main(["dataset", "create", "cut", "--from-mine", "truncated", "--project", p, "--db", pg_url]) == 0
    db.add(feedback_row(p, "outcome", "success", session="t1-a", at=100))  # revised after pinning
    db.commit()
    flags = [
        "train",
        "--alias",
        "agent",
        "--dataset",
        "cut",
        "--model",
        "tiny",
        "--db",
        pg_url,
        "--project",
        p,
        "--adapters",
        str(tmp_path / "adapters"),
        "--no-deploy",
        "--threads",
        "1",
    ]
    settings = train_settings(build_parser().parse_args(flags))
    assert settings.steps is None  # a dataset trains until it is used up
    assert run(settings) == 0
    # Retraining from the dataset (as after a deletion): the same items again, from the base model.
    assert run(train_settings(build_parser().parse_args([*flags, "--parent", "base"]))) == 0
    db.expire_all()
    steps = db.execute(
        select(TrainingStep.adapter_version, TrainingStep.metrics)
        .join(TrainingRun)
        .where(TrainingRun.project_id == p)
        .order_by(TrainingStep.id)
    ).all()
    # One step of both graded items (t3-a is ungraded), on t1-a's pinned failure (0.0), not its revision;
    # the same task, so their advantages are leave-one-out (a running baseline would have learnt them by run 2).
    assert [(v, m["trajectories"], m["reward_mean"]) for v, m in steps] == [(v, 2, pytest.approx(0.15)) for v in (1, 2)]
    for version, parent in ((1, None), (2, None)):
        lineage = version_lineage(db, p, "agent", version)
        assert lineage is not None and (lineage["datasets"], lineage["parent_version"]) == (["cut"], parent)
        assert lineage["trajectories"] == sorted(f"{p}-{s}:0" for s in ("t1-a", "t1-e"))
        assert lineage["feedback"] == sorted(grades[s] for s in ("t1-a", "t1-e"))
    # What a deletion of t1-a would name: both versions, each trained on it directly.
    named = learned_from(db, p, calls=[f"{p}-t1-a"])
    assert named == [{"alias": "agent", "version": v, "direct": True} for v in (1, 2)]
