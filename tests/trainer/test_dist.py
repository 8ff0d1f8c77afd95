"""Two gloo processes under torchrun hand the optimiser the same gradients as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("ddp_step.py")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["tis", "ppo"])
def test_two_gloo_ranks_match_one_process(tmp_path: Path, objective: str) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, str(SCRIPT), str(one), objective])
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(SCRIPT),
            str(two),
            objective,
        ]
    )
    g1, g2 = load_file(f"{one}.grads.safetensors"), load_file(f"{two}.grads.safetensors")
    assert g1.keys() == g2.keys()
    steps = sorted({int(k.split(":")[0]) for k in g1})
    assert steps == list(range(2 if objective == "ppo" else 1))  # ppo: one optimiser step per epoch
    for step in steps:
        keys = [k for k in g1 if k.startswith(f"{step}:")]
        scale = max(float(g1[k].abs().max()) for k in keys)
        assert scale > 1e-6  # the step had a gradient to agree on
        for k in keys:
            # Two partial sums added vs one running sum: float32 rounding, relative to the step's scale.
            torch.testing.assert_close(g2[k], g1[k], atol=1e-5 * scale, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
    r0, r1 = load_file(f"{two}.rank0.safetensors"), load_file(f"{two}.rank1.safetensors")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # both ranks took the same step, bit for bit
    m1, m2 = json.loads(Path(f"{one}.json").read_text()), json.loads(Path(f"{two}.json").read_text())
    assert (m1["world"], m2["world"]) == (1, 2)
    for key in ("tokens", "trajectories", "excluded", "recomputed_logprobs"):
        assert m1[key] == m2[key], key
    assert m1["excluded"] == {"ratio_out_of_band": 1}
    for key in ("loss", "ratio_mean", "ratio_max", "clipped_frac", "ess", "kl_mu_pi"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow
def test_train_command_runs_under_torchrun(pg_url: str, tmp_path: Path) -> None:
    """``torchrun -m onthejob.cli train`` (the README's form) on graded rows in Postgres: rank 0 reads and
    writes the database, both ranks train, and the rows are those one process would write."""
    import uuid

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.models import Adapter, TrainingRun, TrainingStep, UsedFeedback
    from tests.storage.rows import GEN, choice, feedback_row, insert, msg, new_project, row

    engine = sync_engine(pg_url)
    with Session(engine) as db:
        project = new_project(db)
        # Ten graded one-call sessions of one task (tiny-model token ids, no recorded μ: recomputed).
        insert(
            db,
            *(
                row(
                    f"cmpl-{uuid.uuid4().hex[:12]}",
                    msg("user", 40 + i) + GEN,
                    [choice([50 + i, 51, 2], logprobs=None)],
                    session=f"s{i}",
                    project=project,
                    task="add",
                    alias="helper",
                    at=i,
                )
                for i in range(10)
            ),
        )
        db.add_all(
            feedback_row(project, "outcome", "success" if i % 2 else "failure", session=f"s{i}") for i in range(10)
        )
        db.commit()
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            "onthejob.cli",
            "train",
            "--alias",
            "helper",
            "--model",
            "tiny",
            "--db",
            pg_url,
            "--project",
            project,
            "--no-deploy",
            "--steps",
            "2",
            "--batch-size",
            "5",
            "--threads",
            "1",
            "--adapters",
            str(tmp_path),
        ]
    )
    with Session(engine) as db:
        (run,) = db.scalars(select(TrainingRun).where(TrainingRun.project_id == project)).all()
        steps = db.scalars(select(TrainingStep).where(TrainingStep.run_id == run.id).order_by(TrainingStep.step)).all()
        versions = db.scalars(select(Adapter.version).where(Adapter.project_id == project)).all()
        used = db.scalars(select(UsedFeedback.trajectory_id).where(UsedFeedback.project_id == project)).all()
    engine.dispose()
    assert run.status == "finished" and run.config["world_size"] == 2
    assert [(s.step, s.adapter_version, s.metrics["trajectories"]) for s in steps] == [(1, 1, 5), (2, 2, 5)]
    assert sorted(versions) == [1, 2] and len(used) == 10
