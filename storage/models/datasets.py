"""Datasets: named, immutable selections of trajectories, and the items each one holds."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, utcnow


class Dataset(Base):
    """A named, immutable selection of trajectories (storage/datasets.py); ``train`` and ``export`` take one."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    # How it was selected: {"kind": "filter" | "mine" | "curated", "filter": {...}, ...}.
    filter: Mapped[dict[str, Any]] = mapped_column(default=dict)
    counts: Mapped[dict[str, Any]] = mapped_column(default=dict)  # at creation (show recounts what is left)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DatasetItem(Base):
    """One trajectory of a dataset, pinned at creation: its calls (one path) and the feedback and reward it had."""

    __tablename__ = "dataset_items"
    __table_args__ = (
        UniqueConstraint("dataset_id", "trajectory_id"),
        Index("ix_dataset_items_session", "project_id", "session_id"),  # a deleted session's items
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    project_id: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(200))
    task_id: Mapped[str | None] = mapped_column(String(200), default=None)
    trajectory_id: Mapped[str] = mapped_column(String(300))
    role: Mapped[str] = mapped_column(String(16), default="item")  # "item" | curated: "failure" | "success"
    completion_ids: Mapped[list[Any]] = mapped_column(default=list)  # the path, root first
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of token ids and mask: rebuilt the same, or not used
    reward: Mapped[float | None] = mapped_column(Float, default=None)
    reward_detail: Mapped[dict[str, Any]] = mapped_column(default=dict)  # which item the reward came from
    feedback: Mapped[list[Any]] = mapped_column(default=list)  # [{"id", "name", "value", "source", "scalar"}]
