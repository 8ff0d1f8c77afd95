"""``onthejob train`` (trainer.runner) end to end against real Postgres and a stub proxy admin API.

The loader stands in for storage's ``load_training_batch`` (same signature); it
honours ``used_feedback`` the way the real one must.
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from onthejob.cli import build_parser
from onthejob.commands import train_settings
from storage.db import sync_engine
from storage.keys import ensure_project
from storage.models import Adapter, Alias, TrainingRun, TrainingStep, UsedFeedback
from storage.promotion import set_candidate, set_policy
from storage.trajectories import Trajectory
from tests.conftest import free_port
from tests.trainer.helpers import make_trajectory, random_tokens
from trainer.runner import run, summary_line
from trainer.settings import TrainSettings

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


class StubProxy:
    """Answers POST /v1/admin/deployments with a fixed status and records the requests."""

    def __init__(self, status: int = 201, answer: dict[str, Any] | None = None) -> None:
        self.status = status
        self.requests: list[tuple[dict[str, Any], str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                stub.requests.append((body, self.headers.get("authorization", "")))
                payload = json.dumps({"error": {"message": "engine refused"}} if stub.status >= 400 else answer or body)
                self.send_response(stub.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StubProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class Pool:
    """A fixed set of graded trajectories served the way load_training_batch would."""

    def __init__(self, trajectories: list[Trajectory], empty_polls: int = 0) -> None:
        self.trajectories = trajectories
        self.empty_polls = empty_polls
        self.calls = 0

    def __call__(self, db: Session, project_id: str, alias: str) -> tuple[list[Trajectory], Counter[str]]:
        self.calls += 1
        if self.calls <= self.empty_polls:
            return [], Counter({"ungraded": 3})
        used = set(
            db.scalars(
                select(UsedFeedback.trajectory_id).where(
                    UsedFeedback.project_id == project_id, UsedFeedback.alias == alias
                )
            )
        )
        return [t for t in self.trajectories if t.id not in used], Counter({"ungraded": 2})


def _pool(n: int, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    return [
        make_trajectory(
            f"t{seed}-{i}",
            random_tokens(rng, 8),
            random_tokens(rng, 5),
            reward=float(i % 2),
            logprobs=[None] * 5,
            sampling=SAMPLING,
            task=f"task{i % 3}",
            group=None,
        )
        for i in range(n)
    ]


@pytest.fixture
def project(pg_url: str) -> Iterator[str]:
    engine = sync_engine(pg_url)
    name = f"p-{uuid.uuid4().hex[:8]}"
    with Session(engine) as db:
        ensure_project(db, name)
        db.commit()
    engine.dispose()
    yield name


def _args(pg_url: str, project: str, tmp_path: Path, proxy: str, *extra: str) -> TrainSettings:
    """The settings ``onthejob train`` builds from these flags (the CLI's own parser and builder)."""
    return train_settings(
        build_parser().parse_args(
            [
                "train",
                "--alias",
                "helper",
                "--model",
                "tiny",
                "--db",
                pg_url,
                "--project",
                project,
                "--adapters",
                str(tmp_path / "adapters"),
                "--proxy",
                proxy,
                "--admin-key",
                "otj-k",
                "--threads",
                "1",
                "--lr",
                "1e-2",
                *extra,
            ]
        )
    )


def _rows(pg_url: str, project: str) -> tuple[list[TrainingRun], list[TrainingStep], list[Adapter], list[str]]:
    engine = sync_engine(pg_url)
    with Session(engine) as db:
        runs = list(db.scalars(select(TrainingRun).where(TrainingRun.project_id == project).order_by(TrainingRun.id)))
        steps = list(
            db.scalars(
                select(TrainingStep).where(TrainingStep.run_id.in_([r.id for r in runs])).order_by(TrainingStep.id)
            )
        )
        adapters = list(db.scalars(select(Adapter).where(Adapter.project_id == project).order_by(Adapter.version)))
        used = list(db.scalars(select(UsedFeedback.trajectory_id).where(UsedFeedback.project_id == project)))
    engine.dispose()
    return runs, steps, adapters, used


def test_train_records_publishes_and_deploys(
    pg_url: str, project: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = Pool(_pool(10))
    with StubProxy() as proxy:
        code = run(_args(pg_url, project, tmp_path, proxy.url, "--steps", "2", "--batch-size", "6"), loader=pool)
    assert code == 0
    runs, steps, adapters, used = _rows(pg_url, project)
    assert [r.status for r in runs] == ["finished"]
    assert runs[0].base_model == "tiny-qwen2" and runs[0].config["baseline"]["counts"]["*"] == 10
    assert [(s.step, s.adapter_version) for s in steps] == [(1, 1), (2, 2)]
    assert steps[0].metrics["trajectories"] == 6 and steps[1].metrics["trajectories"] == 4
    assert steps[0].metrics["excluded"] == {"ungraded": 2}
    assert [(a.version, a.parent_version, a.training_run_id) for a in adapters] == [
        (1, None, runs[0].id),
        (2, 1, runs[0].id),
    ]
    assert sorted(used) == sorted(t.id for t in pool.trajectories)
    assert proxy.requests == [
        ({"alias": "helper", "version": 1, "candidate": True}, "Bearer otj-k"),
        ({"alias": "helper", "version": 2, "candidate": True}, "Bearer otj-k"),
    ]
    out = capsys.readouterr().err
    assert "step 1 v1: loss" in out and "· deployed" in out and "ungraded=2" in out


def test_a_second_run_resumes_from_the_latest_adapter(pg_url: str, project: str, tmp_path: Path) -> None:
    first = Pool(_pool(4, seed=1))
    assert run(_args(pg_url, project, tmp_path, "http://unused", "--no-deploy"), loader=first) == 0
    second = Pool(_pool(4, seed=2))
    assert run(_args(pg_url, project, tmp_path, "http://unused", "--no-deploy"), loader=second) == 0
    runs, _, adapters, _ = _rows(pg_url, project)
    assert [(a.version, a.parent_version) for a in adapters] == [(1, None), (2, 1)]
    assert runs[1].config["parent_version"] == 1
    assert runs[1].config["baseline"]["counts"]["*"] == 8  # carried over from the first run


def test_held_versions_are_never_parents_under_gate(
    pg_url: str, project: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under gate the proxy holds each published version; the next step (same run, or a new one with
    ``--parent latest``) starts from the serving version, never from the unpromoted candidate."""
    engine = sync_engine(pg_url)
    with Session(engine) as db:
        db.add(Alias(project_id=project, name="helper", base_model="tiny-qwen2"))
        set_policy(db, project, "helper", "gate", {})
        db.commit()
    pending = {"alias": "helper", "policy": "gate", "status": "pending"}
    with StubProxy(answer=pending) as proxy:
        assert (
            run(_args(pg_url, project, tmp_path, proxy.url, "--steps", "2", "--batch-size", "2"), loader=Pool(_pool(4)))
            == 0
        )
        assert "continuing from the base model (serving), not v1 (not promoted)" in capsys.readouterr().err
        with Session(engine) as db:  # v2 was promoted meanwhile; v3 is then published and held
            db.execute(update(Alias).where(Alias.project_id == project).values(deployed_version=2))
            db.commit()
        assert run(_args(pg_url, project, tmp_path, proxy.url), loader=Pool(_pool(2, seed=5))) == 0
        with Session(engine) as db:
            set_candidate(db, project, "helper", 3)
            db.commit()
        assert run(_args(pg_url, project, tmp_path, proxy.url), loader=Pool(_pool(2, seed=6))) == 0
    engine.dispose()
    _, _, adapters, _ = _rows(pg_url, project)
    # auto would chain 1 <- 2 <- 3 <- 4 (the test above); under gate each starts from what served
    assert [(a.version, a.parent_version) for a in adapters] == [(1, None), (2, None), (3, 2), (4, 2)]


def test_nothing_to_train_is_said_and_not_an_error(
    pg_url: str, project: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_args(pg_url, project, tmp_path, "http://unused"), loader=Pool([], empty_polls=1)) == 0
    assert "no graded trajectories to train on for 'helper' (excluded: ungraded=3)" in capsys.readouterr().err
    runs, steps, adapters, _ = _rows(pg_url, project)
    assert [r.status for r in runs] == ["finished"] and steps == [] and adapters == []


def test_watch_waits_for_data(pg_url: str, project: str, tmp_path: Path) -> None:
    pool = Pool(_pool(3), empty_polls=2)
    args = _args(pg_url, project, tmp_path, "http://unused", "--watch", "--steps", "1", "--poll", "0.01", "--no-deploy")
    assert run(args, loader=pool) == 0
    assert pool.calls == 3
    _, steps, _, _ = _rows(pg_url, project)
    assert [s.adapter_version for s in steps] == [1]


def test_a_refused_deployment_is_a_clear_error_after_bookkeeping(
    pg_url: str, project: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = Pool(_pool(4))
    with StubProxy(status=502) as proxy:
        code = run(_args(pg_url, project, tmp_path, proxy.url), loader=pool)
    assert code == 2
    assert "proxy refused to deploy helper@v1: HTTP 502 engine refused" in capsys.readouterr().err
    runs, steps, adapters, used = _rows(pg_url, project)
    assert [r.status for r in runs] == ["failed"]
    assert [a.version for a in adapters] == [1] and len(steps) == 1 and len(used) == 4  # never trained on twice


def test_unknown_parent_is_refused(
    pg_url: str, project: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(_args(pg_url, project, tmp_path, "http://unused", "--parent", "9"), loader=Pool(_pool(2)))
    assert code == 2
    assert "helper@v9 is not recorded" in capsys.readouterr().err


def test_summary_line_handles_missing_values() -> None:
    from trainer.loop import StepResult

    line = summary_line(3, None, StepResult({"loss": None, "tokens": 0}, [], Counter({"too_long": 2}), False))
    assert line.startswith("step 3 no adapter: loss -") and "too_long=2" in line


def test_the_default_feed_trains_each_graded_session_once_with_its_feedback(
    pg_url: str, project: str, tmp_path: Path
) -> None:
    """No loader given: storage's incremental feed. Each trajectory is recorded used with its grade's id."""
    from tests.storage.rows import GEN, choice, feedback_row, insert, msg, row

    engine = sync_engine(pg_url)
    with Session(engine) as db:
        insert(
            db,
            *(
                row(
                    f"{project}-{i}",
                    msg("user", 40 + i) + GEN,
                    [choice([50 + i, 51, 2], logprobs=None)],
                    session=f"s{i}",
                    project=project,
                    task="add",
                    alias="helper",
                    at=i,
                )
                for i in range(3)
            ),
        )
        grades = [
            feedback_row(project, "outcome", "success" if i % 2 else "failure", session=f"s{i}") for i in range(3)
        ]
        db.add_all(grades)
        db.commit()
        grade_ids = {f"{project}-{i}:0": g.id for i, g in enumerate(grades)}
    args = _args(pg_url, project, tmp_path, "http://unused", "--no-deploy", "--steps", "3", "--batch-size", "2")
    assert run(args) == 0
    assert run(args) == 0  # a second run resumes from the saved cursor: nothing left to train
    with Session(engine) as db:
        used = db.execute(
            select(UsedFeedback.trajectory_id, UsedFeedback.feedback_id, UsedFeedback.objective).where(
                UsedFeedback.project_id == project
            )
        ).all()
        steps = db.scalars(select(TrainingStep.step).join(TrainingRun).where(TrainingRun.project_id == project)).all()
    engine.dispose()
    assert sorted(used) == sorted((t, f, "reward") for t, f in grade_ids.items())
    assert sorted(steps) == [1, 2]  # two by the first run (2 + 1 trajectories), none by the second


def test_the_task_baseline_carries_over_except_for_a_dataset_or_a_restart_from_base(pg_url: str, project: str) -> None:
    from trainer.run_rows import resume_point

    with Session(sync_engine(pg_url)) as db:
        learnt = {"tasks": {"t1": [0.9, 3]}}
        db.add(
            TrainingRun(
                project_id=project, alias="agent", objective="tis", base_model="tiny", config={"baseline": learnt}
            )
        )
        db.commit()
        settings = TrainSettings(alias="agent", database_url=pg_url, project=project)
        assert resume_point(db, settings)[2] == learnt
        for fresh in (
            TrainSettings(alias="agent", database_url=pg_url, project=project, dataset="cut"),
            TrainSettings(alias="agent", database_url=pg_url, project=project, parent="base"),
        ):
            assert resume_point(db, fresh) == (None, None, None)
