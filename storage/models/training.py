"""What training made and used: adapters, deployments, runs and their steps, what each step used, judge calibrations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, utcnow

ADAPTER_RESERVED = "reserved"
ADAPTER_COMMITTED = "committed"


class Adapter(Base):
    """One published LoRA adapter version of an alias.

    ``state``: a publish inserts the row ``reserved`` (the version number is its own from then on, its
    folder not yet in place) and marks it ``committed`` once the folder holds the weights ``sha256`` names.
    Only committed versions may be listed, deployed or trained from (``Adapter.committed()``); a reserved
    row a crash left behind keeps its number, so ``alias@vN`` never names two different adapters.
    """

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("project_id", "alias", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int]
    parent_version: Mapped[int | None] = mapped_column(default=None)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    base_model: Mapped[str] = mapped_column(String(200))
    base_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    training_run_id: Mapped[int | None] = mapped_column(ForeignKey("training_runs.id"), default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    state: Mapped[str] = mapped_column(String(16), default=ADAPTER_COMMITTED, server_default=ADAPTER_COMMITTED)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @classmethod
    def committed(cls) -> ColumnElement[bool]:
        """The filter every reader of published versions applies (reserved rows are a publish in flight)."""
        return cls.state == ADAPTER_COMMITTED


class Deployment(Base):
    """History of routing switches for an alias; the alias row holds the current one."""

    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int | None] = mapped_column(default=None)  # None: back to the base model
    previous_version: Mapped[int | None] = mapped_column(default=None)
    status: Mapped[str] = mapped_column(String(32))  # "active" | "failed" | "superseded"
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrainingRun(Base):
    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    objective: Mapped[str] = mapped_column(String(16))
    base_model: Mapped[str] = mapped_column(String(200))
    base_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class TrainingStep(Base):
    __tablename__ = "training_steps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("training_runs.id"), index=True)
    step: Mapped[int]
    adapter_version: Mapped[int | None] = mapped_column(default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsedTrajectory(Base):
    """Which trajectories a training step consumed, so none is trained on twice."""

    __tablename__ = "used_trajectories"
    __table_args__ = (UniqueConstraint("project_id", "alias", "trajectory_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    trajectory_id: Mapped[str] = mapped_column(String(300))
    step_id: Mapped[int] = mapped_column(ForeignKey("training_steps.id"))


class JudgeCalibration(Base):
    """How one judge configuration agreed with a project's existing grades; the newest per fingerprint counts."""

    __tablename__ = "judge_calibrations"
    __table_args__ = (Index("ix_judge_calibrations_lookup", "project_id", "fingerprint", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    fingerprint: Mapped[str] = mapped_column(String(64))  # JudgeSettings.fingerprint(): what changes a score
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the settings it was measured under
    n: Mapped[int]  # labelled pairs with a readable judge score
    unreadable: Mapped[int] = mapped_column(default=0)
    spearman: Mapped[float] = mapped_column(Float)
    accuracy: Mapped[float] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    baseline: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the keyword scorer on the same set
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsedFeedback(Base):
    """Which (trajectory, text feedback item, objective) a step trained on: SDPO and corrections, once each.

    Kept apart from ``used_trajectories`` (scalar rewards, once per trajectory): a comment that
    arrives after a session was trained on numerically still yields its self-distillation example.
    """

    __tablename__ = "used_feedback"
    # Not unique (migration 0015): the feed never takes a key twice (it screens on these columns), but a
    # retraining from a dataset (``train --dataset``, e.g. after a deletion) trains the same items again on
    # purpose, and its version's lineage must record them.
    __table_args__ = (
        Index("ix_used_feedback_lookup", "project_id", "alias", "trajectory_id", "feedback_id", "objective"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    trajectory_id: Mapped[str] = mapped_column(String(300))
    feedback_id: Mapped[str] = mapped_column(String(200))  # a feedback row's id, or "implicit:<completion id>"
    objective: Mapped[str] = mapped_column(String(16))  # "reward" (scalar) | "sdpo" | "correction"
    step_id: Mapped[int] = mapped_column(ForeignKey("training_steps.id"))
