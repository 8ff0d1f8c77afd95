"""Datasets: named, immutable selections of trajectories that ``train`` and ``export`` take.

A dataset is chosen once, by a filter (alias, tags, time, reward range, failure
flags, feedback names, judge agreement), by a failure mode of ``onthejob mine``,
or as a curated set (failures with the best successes of the same task), and
pinned at creation: per trajectory, the completion ids of its path, a digest of
its tokens, the feedback items about it (ids and values) and the reward they gave.
Training it tomorrow trains the same tokens on the same rewards, whatever feedback
arrives or is revised meanwhile (:mod:`storage.dataset_load` rebuilds them). Choosing
reads a page of sessions at a time (:mod:`storage.dataset_select`).

Nothing is ever updated: a name is taken once per project (:class:`DatasetExists`).
A deleted session (a tombstone, :mod:`storage.deletion`) vanishes from every read:
``show``, ``diff``, ``export`` and ``train`` count only items whose session is alive.

Errors (one tree, mapped by the admin routes and the CLI; defined with the filter in
:mod:`storage.dataset_filter` and importable from here)::

    DatasetError          a bad specification; the message names the key (400)
    ├── DatasetExists     the name is taken in this project (409)
    └── DatasetNotFound   no such dataset in this project (404)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import ColumnElement, exists, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session as DbSession

from storage.dataset_filter import DatasetError as DatasetError
from storage.dataset_filter import DatasetExists as DatasetExists
from storage.dataset_filter import DatasetFilter as DatasetFilter
from storage.dataset_filter import DatasetNotFound as DatasetNotFound
from storage.dataset_select import Candidate, Curator, candidates, digest, matches
from storage.grading import Grade
from storage.loaders import settings_stmt
from storage.mining import MODES, MineConfig
from storage.models import Completion, Dataset, DatasetItem, Tombstone

# --------------------------------------------------------------------------- the specification


@dataclass(frozen=True)
class Spec:
    """How a dataset is selected: a filter; a mine mode (the filter plus that flag); or the curated set."""

    filter: DatasetFilter = field(default_factory=DatasetFilter)
    from_mine: str | None = None
    curated: bool = False
    per_task: int = 2  # curated: the best successes kept per failing task

    def __post_init__(self) -> None:
        if self.from_mine is not None and self.from_mine not in MODES:
            raise DatasetError(f"from_mine: {self.from_mine!r} is not a failure mode; use {', '.join(MODES)}")
        if self.per_task < 0:
            raise DatasetError(f"per_task: {self.per_task} must be 0 or more")

    @property
    def kind(self) -> str:
        return "curated" if self.curated else "mine" if self.from_mine else "filter"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "filter": self.filter.to_dict()}
        if self.from_mine:
            out["from_mine"] = self.from_mine
        if self.curated:
            out["per_task"] = self.per_task
        return out


# --------------------------------------------------------------------------- pinning


def _pinned_feedback(grades: Iterable[Grade], detail: Mapping[str, Any]) -> list[dict[str, Any]]:
    scalars = {c.get("feedback_id"): c.get("scalar") for c in detail.get("candidates") or []}
    return [
        {
            "id": g.id,
            "name": g.name,
            "value": g.value,
            "source": g.source,
            "completion_id": g.completion_id,
            "scalar": scalars.get(g.id),
        }
        for g in grades
    ]


# --------------------------------------------------------------------------- reading the database


def alive(project: str) -> ColumnElement[bool]:
    """An item whose session is neither deleted (tombstoned since its dataset was made) nor gone (no call of it
    left). A session deleted before the dataset was made and started afresh since is alive (storage/deletion.py)."""
    of_item = select(Dataset.created_at).where(Dataset.id == DatasetItem.dataset_id).correlate(DatasetItem)
    made = of_item.scalar_subquery()
    dead = exists().where(
        Tombstone.project_id == project, Tombstone.session_id == DatasetItem.session_id, Tombstone.created_at >= made
    )
    calls = exists().where(Completion.project_id == project, Completion.session_id == DatasetItem.session_id)
    return ~dead & calls


def get(db: DbSession, project: str, name: str) -> Dataset:
    row = db.scalar(select(Dataset).where(Dataset.project_id == project, Dataset.name == name))
    if row is None:
        raise DatasetNotFound(f"no dataset {name!r} in this project")
    return row


def items(db: DbSession, project: str, dataset: Dataset) -> list[DatasetItem]:
    """The dataset's items still alive, in pinning order."""
    stmt = select(DatasetItem).where(DatasetItem.dataset_id == dataset.id, alive(project)).order_by(DatasetItem.id)
    return list(db.scalars(stmt))


# --------------------------------------------------------------------------- create, list, show, diff


def _pin(dataset: Dataset, c: Candidate, role: str) -> DatasetItem:
    t = c.traj
    return DatasetItem(
        dataset_id=dataset.id,
        project_id=dataset.project_id,
        session_id=t.session_id,
        task_id=t.task_id,
        trajectory_id=t.id,
        role=role,
        completion_ids=list(t.completion_ids),
        digest=digest(t),
        reward=t.reward,
        reward_detail=t.reward_detail,
        feedback=_pinned_feedback(c.grades, t.reward_detail),
    )


def create(
    db: DbSession, project: str, name: str, spec: Spec, description: str = "", page: int = 500
) -> dict[str, Any]:
    """Select and pin, ``page`` sessions at a time; the caller commits. A taken name raises :class:`DatasetExists`."""
    if not name or len(name) > 200 or "\x00" in name:
        raise DatasetError("name: 1 to 200 characters, no NUL")
    if db.scalar(select(Dataset.id).where(Dataset.project_id == project, Dataset.name == name)) is not None:
        raise DatasetExists(f"dataset {name!r} exists in this project; datasets are immutable, choose another name")
    try:
        threshold = MineConfig.from_settings(db.scalar(settings_stmt(project))).low_grade
    except ValueError as exc:  # the project's "mine" settings
        raise DatasetError(str(exc)) from exc
    dataset = Dataset(project_id=project, name=name, description=description, filter=spec.to_dict(), counts={})
    db.add(dataset)
    try:
        db.flush()
    except IntegrityError as exc:  # created by someone else meanwhile
        db.rollback()
        raise DatasetExists(f"dataset {name!r} exists in this project; datasets are immutable") from exc
    base = replace(spec.filter, flags=(spec.from_mine,)) if spec.from_mine else spec.filter
    tally = Tally()

    def add(c: Candidate, role: str) -> None:
        item = _pin(dataset, c, role)
        tally.add(item)
        db.add(item)
        if tally.trajectories % page == 0:
            db.flush()  # written, and nothing here keeps the items

    if spec.curated:  # the flags say what a failure is; successes come from the same sessions and times
        unflagged = replace(base, flags=())
        curator = Curator(frozenset(base.flags), threshold, spec.per_task)
        for c in candidates(db, project, unflagged, page):
            if matches(c, unflagged, threshold) and curator.add(c):
                add(c, "failure")
        for c in curator.successes():
            add(c, "success")
    else:
        for c in candidates(db, project, base, page):
            if matches(c, base, threshold):
                add(c, "item")
    dataset.counts = tally.to_dict()
    db.flush()
    return summary(dataset, dataset.counts)


@dataclass
class Tally:
    """A dataset's counts, one item at a time."""

    trajectories: int = 0
    graded: int = 0
    sessions: set[str] = field(default_factory=set)
    feedback: set[str] = field(default_factory=set)
    roles: Counter[str] = field(default_factory=Counter)

    def add(self, item: DatasetItem) -> None:
        self.trajectories += 1
        self.graded += item.reward is not None
        self.sessions.add(item.session_id)
        self.feedback.update(f["id"] for f in item.feedback)
        self.roles[item.role] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "sessions": len(self.sessions),
            "graded": self.graded,
            "feedback": len(self.feedback),
            **({"roles": dict(sorted(self.roles.items()))} if set(self.roles) - {"item"} else {}),
        }


def _counts(rows: Iterable[DatasetItem]) -> dict[str, Any]:
    tally = Tally()
    for row in rows:
        tally.add(row)
    return tally.to_dict()


def summary(dataset: Dataset, counts: Mapping[str, Any]) -> dict[str, Any]:
    """What list and create answer about one dataset."""
    return {
        "object": "dataset",
        "name": dataset.name,
        "description": dataset.description,
        "created_at": dataset.created_at.isoformat() if dataset.created_at else None,
        "filter": dataset.filter,
        "counts": dict(counts),
        "removed": max(0, dataset.counts.get("trajectories", 0) - counts.get("trajectories", 0)),
    }


def list_datasets(db: DbSession, project: str) -> list[dict[str, Any]]:
    """Every dataset of the project, oldest first, counting only items still alive."""
    live = dict(
        db.execute(
            select(DatasetItem.dataset_id, func.count())
            .where(DatasetItem.project_id == project, alive(project))
            .group_by(DatasetItem.dataset_id)
        ).all()
    )
    out = []
    for dataset in db.scalars(select(Dataset).where(Dataset.project_id == project).order_by(Dataset.id)):
        counts = {**dataset.counts, "trajectories": live.get(dataset.id, 0)}
        out.append(summary(dataset, counts))
    return out


def item_view(item: DatasetItem) -> dict[str, Any]:
    return {
        "trajectory_id": item.trajectory_id,
        "session_id": item.session_id,
        "task_id": item.task_id,
        "role": item.role,
        "completion_ids": item.completion_ids,
        "reward": item.reward,
        "reward_feedback_id": item.reward_detail.get("feedback_id"),
        "feedback": item.feedback,
    }


def show(db: DbSession, project: str, name: str) -> dict[str, Any]:
    """The dataset and its items still alive (a deleted session's items are gone from here)."""
    dataset = get(db, project, name)
    rows = items(db, project, dataset)
    return {**summary(dataset, _counts(rows)), "items": [item_view(i) for i in rows]}


def _values(item: DatasetItem) -> dict[str, Any]:
    return {
        "completion_ids": item.completion_ids,
        "reward": item.reward,
        "feedback": sorted((f["id"], json.dumps(f["value"], sort_keys=True)) for f in item.feedback),
    }


def diff(db: DbSession, project: str, a: str, b: str) -> dict[str, Any]:
    """Items only in ``a``, only in ``b``, and in both with a different path, reward or feedback."""
    left = {i.trajectory_id: i for i in items(db, project, get(db, project, a))}
    right = {i.trajectory_id: i for i in items(db, project, get(db, project, b))}
    changed = []
    for tid in sorted(left.keys() & right.keys()):
        if _values(left[tid]) != _values(right[tid]):
            changed.append({"trajectory_id": tid, "a": item_view(left[tid]), "b": item_view(right[tid])})
    return {
        "object": "dataset.diff",
        "a": a,
        "b": b,
        "only_a": [item_view(left[t]) for t in sorted(left.keys() - right.keys())],
        "only_b": [item_view(right[t]) for t in sorted(right.keys() - left.keys())],
        "changed": changed,
        "same": len(left.keys() & right.keys()) - len(changed),
    }
