"""A training run's rows: where it resumes from, the lineage it must match, the run and its steps
(with what each step used), and how it ended. The runner (trainer/runner.py) calls these; rank 0 only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import Adapter, Alias, TrainingRun, TrainingStep, utcnow
from storage.promotion import training_parent
from storage.trajectories import Trajectory
from storage.used import mark_used, reward_key
from trainer import dist
from trainer.advantages import TaskBaseline
from trainer.errors import BaseModelError, DataError
from trainer.loop import StepResult
from trainer.policy import Policy, TrainConfig
from trainer.publish import jsonable
from trainer.settings import TrainSettings
from trainer.textual import TextualExample


def resume_point(db: Session, settings: TrainSettings) -> tuple[int | None, str | None, dict[str, Any] | None]:
    """Which adapter to continue from (``parent``) and the per-task baseline of the last run."""
    parent_version: int | None
    choice = settings.parent
    if choice == "base":
        parent_version = None
    elif choice == "latest" and training_parent(db, settings.project, settings.alias)[0]:
        # gate/canary: what was last published may be held; the next step starts from what serves
        parent_version = training_parent(db, settings.project, settings.alias)[1]
    elif choice == "latest":
        latest = db.scalar(
            select(Adapter.version)
            .where(Adapter.project_id == settings.project, Adapter.alias == settings.alias, Adapter.committed())
            .order_by(Adapter.version.desc())
            .limit(1)
        )
        parent_version = latest
    elif choice == "deployed":
        alias = db.scalar(select(Alias).where(Alias.project_id == settings.project, Alias.name == settings.alias))
        parent_version = alias.deployed_version if alias else None
    else:
        parent_version = settings.parent_version  # a number: TrainSettings refused anything else
    path = None
    if parent_version is not None:
        row = adapter_row(db, settings, parent_version)
        if row is None:
            raise DataError(
                f"--parent: {settings.alias}@v{parent_version} is not recorded in project {settings.project!r}"
            )
        if not Path(row.path).is_dir():
            raise DataError(f"{settings.alias}@v{parent_version} is recorded at {row.path}, which does not exist here")
        path = row.path
    last = db.scalar(
        select(TrainingRun)
        .where(TrainingRun.project_id == settings.project, TrainingRun.alias == settings.alias)
        .order_by(TrainingRun.id.desc())
        .limit(1)
    )
    # The per-task baseline carries over from the last run, except for a dataset (it must train the same
    # tomorrow, whatever ran since) and a restart from the base model (what was learnt is dropped with it).
    fresh = settings.dataset is not None or choice == "base"
    baseline = (last.config or {}).get("baseline") if last is not None and not fresh else None
    return parent_version, path, baseline


def serving_parent(
    db: Session | None, settings: TrainSettings, current: int | None
) -> tuple[int | None, str | None] | None:
    """Under gate/canary with ``--parent latest``: (version, path) of the serving version when the policy in
    memory is another one (a candidate not promoted); None when training may continue as it is."""
    assert db is not None
    if settings.parent != "latest":
        return None
    holds, serving = training_parent(db, settings.project, settings.alias)
    db.rollback()
    if not holds or serving == current:
        return None
    row = adapter_row(db, settings, serving) if serving is not None else None
    return serving, row.path if row is not None else None


def adapter_row(db: Session, settings: TrainSettings, version: int) -> Adapter | None:
    return db.scalar(
        select(Adapter).where(
            Adapter.project_id == settings.project,
            Adapter.alias == settings.alias,
            Adapter.version == version,
            Adapter.committed(),
        )
    )


def check_lineage(db: Session, settings: TrainSettings, policy: Policy, parent_version: int | None) -> None:
    """The alias's base model and the parent adapter's base hash must be the weights we loaded."""
    alias = db.scalar(select(Alias).where(Alias.project_id == settings.project, Alias.name == settings.alias))
    if alias is not None and alias.base_model != policy.info.name:
        raise BaseModelError(
            f"alias {settings.alias!r} serves base model {alias.base_model!r}, but --model {settings.model!r} "
            f"is {policy.info.name!r}; pass the engine's --model"
        )
    if parent_version is not None:
        row = adapter_row(db, settings, parent_version)
        if row is not None and row.base_sha256 and row.base_sha256 != policy.info.sha256:
            raise BaseModelError(
                f"{settings.alias}@v{parent_version} was trained on base weights {row.base_sha256[:12]}, "
                f"these are {policy.info.sha256[:12]}"
            )


def start_run(
    db: Session,
    settings: TrainSettings,
    cfg: TrainConfig,
    policy: Policy,
    parent_version: int | None,
    baseline: dict[str, Any] | None,
) -> TrainingRun:
    config = {
        **cfg.to_dict(),
        "parent_version": parent_version,
        "batch_size": settings.batch_size,
        "world_size": dist.world(),
        "baseline": baseline or TaskBaseline().to_dict(),
        **({"dataset": settings.dataset} if settings.dataset is not None else {}),  # the versions' lineage reads it
    }
    row = TrainingRun(
        project_id=settings.project,
        alias=settings.alias,
        objective=cfg.objective.name,
        base_model=policy.info.name,
        base_sha256=policy.info.sha256,
        config=config,
    )
    db.add(row)
    db.commit()
    return row


def adapter_paths(db: Session | None, settings: TrainSettings) -> dict[int, Path]:
    """Every recorded version of the alias whose directory exists (for recomputing a missing μ)."""
    assert db is not None
    rows = db.execute(
        select(Adapter.version, Adapter.path).where(
            Adapter.project_id == settings.project, Adapter.alias == settings.alias, Adapter.committed()
        )
    ).all()
    return {int(v): Path(p) for v, p in rows if Path(p).is_dir()}


def record_step(
    db: Session,
    settings: TrainSettings,
    run_row: TrainingRun,
    step: int,
    version: int | None,
    result: StepResult,
    baseline: TaskBaseline,
    batch: Sequence[Trajectory] = (),
    textual: Sequence[TextualExample] = (),
) -> None:
    row = TrainingStep(run_id=run_row.id, step=step, adapter_version=version, metrics=jsonable(result.metrics))
    db.add(row)
    db.flush()
    if result.trained:
        mark_used(db, settings.project, settings.alias, [e.key for e in textual], row.id)
    # Each trajectory is used with the feedback its reward came from (storage/used.py).
    by_id = {t.id: t for t in batch}
    keys = (reward_key(by_id[tid]) for tid in result.consumed if tid in by_id)
    mark_used(db, settings.project, settings.alias, [k for k in keys if k is not None], row.id)
    run_row.config = {**run_row.config, "baseline": baseline.to_dict()}
    db.commit()


def finish(db: Session | None, run_row: TrainingRun | None, status: str) -> None:
    if db is None or run_row is None:
        return
    try:
        db.rollback()
        run_row.status = status
        run_row.finished_at = utcnow()
        db.commit()
    except Exception:  # noqa: BLE001 - never hide the error that got us here
        db.rollback()
