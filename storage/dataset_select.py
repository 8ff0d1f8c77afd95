"""Choosing a dataset's trajectories: the filter's conditions and the curated set, over candidates read page by page.

The conditions (:func:`matches`) and the curated set (:class:`Curator`) are pure; :func:`candidates`
reads the sessions a filter can touch a page at a time (their calls, feedback and failure flags),
so making a dataset holds one page of sessions, the items chosen so far (ids and values, no
tokens) and, for the curated set, the best few successes per task.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage.dataset_filter import DatasetFilter
from storage.grading import JUDGE_SOURCE, Grade, apply_rewards, current, grades_about, resolve_grades
from storage.loaders import feedback_listed_stmt, project_rule, sessions_subquery
from storage.models import Completion, CompletionFlag
from storage.trajectories import Trajectory, assemble


@dataclass(frozen=True)
class Candidate:
    """One trajectory with what the filter reads about it."""

    traj: Trajectory
    at: datetime | None  # its last call's time
    grades: tuple[Grade, ...]  # the current feedback items about it
    modes: frozenset[str]  # failure modes flagged on its calls


def judge_agrees(detail: Mapping[str, Any], threshold: float) -> bool | None:
    """Whether the judge's grade and a harness or human grade fall on the same side of ``threshold``.

    Read from the reward rule's candidates; None when the trajectory lacks one of the two.
    """
    scalars = [(c.get("source") == JUDGE_SOURCE, c.get("scalar")) for c in detail.get("candidates") or []]
    judge = [s for j, s in scalars if j and isinstance(s, float)]
    other = [s for j, s in scalars if not j and isinstance(s, float)]
    if not judge or not other:
        return None
    return (judge[0] >= threshold) == (other[0] >= threshold)


def matches(c: Candidate, f: DatasetFilter, threshold: float = 0.5) -> bool:
    """Whether one trajectory passes every condition of the filter."""
    t = c.traj
    reward_ok = (f.min_reward is None and f.max_reward is None) or (
        t.reward is not None
        and (f.min_reward is None or t.reward >= f.min_reward)
        and (f.max_reward is None or t.reward <= f.max_reward)
    )
    judge = judge_agrees(t.reward_detail, threshold) if f.judge else None
    return (
        (f.alias is None or t.alias == f.alias)
        and all(tag in t.tags for tag in f.tags)
        and (f.since is None or (c.at is not None and c.at >= f.since))
        and (f.until is None or (c.at is not None and c.at < f.until))
        and reward_ok
        and (not f.flags or bool(c.modes & set(f.flags)))
        and (not f.feedback or any(g.name in f.feedback for g in c.grades))
        and (f.judge is None or judge is (f.judge == "agrees"))
    )


@dataclass
class Curator:
    """The curated set, one candidate at a time: failures as they come, then the best successes of failing tasks.

    A failure is flagged with one of ``failure_modes`` (with none given: flagged with any mode, or
    graded below ``threshold``). A success is graded at or above it and never flagged; the best
    ``per_task`` of each task are kept (by reward, then id) and handed out for the tasks that failed.
    """

    failure_modes: frozenset[str]
    threshold: float
    per_task: int
    failing: set[str] = field(default_factory=set)
    best: dict[str, list[Candidate]] = field(default_factory=dict)

    def add(self, c: Candidate) -> bool:
        """True when ``c`` is a failure (pin it now); a success is kept if it is among its task's best."""
        t = c.traj
        wanted = self.failure_modes
        graded_low = not wanted and t.reward is not None and t.reward < self.threshold
        if ((c.modes & wanted) if wanted else c.modes) or graded_low:
            if t.task_id is not None:
                self.failing.add(t.task_id)
            return True
        if t.task_id is not None and not c.modes and t.reward is not None and t.reward >= self.threshold:
            kept = sorted([*self.best.get(t.task_id, []), c], key=lambda k: (-(k.traj.reward or 0.0), k.traj.id))
            self.best[t.task_id] = kept[: self.per_task]
        return False

    def successes(self) -> list[Candidate]:
        """The kept successes of the tasks that failed, task by task."""
        return [c for task in sorted(self.failing & set(self.best)) for c in self.best[task]]


def curate(
    pool: Sequence[Candidate], failure_modes: Iterable[str], threshold: float, per_task: int
) -> list[tuple[Candidate, str]]:
    """The curated set of a whole pool: ``(candidate, "failure" | "success")``, failures first."""
    curator = Curator(frozenset(failure_modes), threshold, per_task)
    failures = [(c, "failure") for c in pool if curator.add(c)]
    return failures + [(c, "success") for c in curator.successes()]


def digest(traj: Trajectory) -> str:
    """sha256 of a trajectory's token ids and mask: what its rebuild must reproduce."""
    return hashlib.sha256(json.dumps([traj.token_ids, traj.mask]).encode()).hexdigest()


def candidates(db: DbSession, project: str, f: DatasetFilter, page: int = 500) -> Iterator[Candidate]:
    """Every trajectory of the sessions the filter can touch, with its grades and flags, ``page`` sessions a query."""
    sessions = sessions_subquery(project, alias=f.alias, since=f.since)
    if f.flags:  # a mine mode: only flagged sessions are read
        flagged = select(CompletionFlag.session_id).where(
            CompletionFlag.project_id == project, CompletionFlag.mode.in_(f.flags)
        )
        sessions = sessions.where(Completion.session_id.in_(flagged))
    ids = list(db.scalars(sessions.order_by(Completion.session_id)))
    rule = project_rule(db, project)
    for start in range(0, len(ids), page):
        chunk = ids[start : start + page]
        calls = list(
            db.scalars(
                select(Completion)
                .where(Completion.project_id == project, Completion.session_id.in_(chunk))
                .order_by(Completion.session_id, Completion.created_at, Completion.id)
            )
        )
        requests = [c.client_request_id for c in calls if c.client_request_id]
        grades = resolve_grades(
            db.scalars(feedback_listed_stmt(project, chunk, [c.id for c in calls], requests)), calls
        )
        trajectories = assemble(calls)
        apply_rewards(trajectories, grades, rule)
        modes: dict[str, set[str]] = {}
        for cid, mode in db.execute(
            select(CompletionFlag.completion_id, CompletionFlag.mode).where(
                CompletionFlag.project_id == project, CompletionFlag.session_id.in_(chunk)
            )
        ):
            modes.setdefault(cid, set()).add(mode)
        at = {c.id: c.created_at for c in calls}
        for t in trajectories:
            yield Candidate(
                traj=t,
                at=at.get(t.completion_ids[-1]) if t.completion_ids else None,
                grades=tuple(current(grades_about(t, grades))),
                modes=frozenset(m for cid in t.completion_ids for m in modes.get(cid, ())),
            )
