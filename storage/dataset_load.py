"""A dataset's pinned trajectories, rebuilt for ``train --dataset`` and ``export --dataset``.

Each item is rebuilt from exactly its pinned calls (the path recorded at creation,
whatever the session did afterwards) and given its pinned reward and feedback, not
what the feedback says today. An item is left out, and counted, when its session was
deleted (it is simply not read: :func:`storage.datasets.items`), a pinned call is gone
(``call_gone``), or the rebuilt tokens differ from the pinned digest (``changed``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage import datasets
from storage.alignment import infer_end_of_turn
from storage.dataset_select import digest
from storage.grading import Exclusion, training_exclusion
from storage.models import Completion
from storage.trajectories import Trajectory, branches, build_trajectory, to_call, trajectory_id


def pinned(db: DbSession, project: str, name: str) -> tuple[list[Completion], list[Trajectory], Counter[str]]:
    """The calls read, the dataset's trajectories (pinned rewards) and what was left out, by reason."""
    rows = datasets.items(db, project, datasets.get(db, project, name))
    sessions = sorted({i.session_id for i in rows})
    calls: list[Completion] = []
    for start in range(0, len(sessions), 1000):
        calls += db.scalars(
            select(Completion)
            .where(Completion.project_id == project, Completion.session_id.in_(sessions[start : start + 1000]))
            .order_by(Completion.created_at, Completion.id)
        )
    by_id = {c.id: to_call(c) for c in calls}
    by_session: dict[str, list[str]] = {}
    for c in calls:
        by_session.setdefault(c.session_id, []).append(c.id)
    # End-of-turn tokens are inferred from the whole session, as when the dataset was made.
    eot = {s: infer_end_of_turn([by_id[c] for c in ids]) for s, ids in by_session.items()}
    out: list[Trajectory] = []
    left_out: Counter[str] = Counter()
    for item in rows:
        path_calls = [by_id.get(cid) for cid in item.completion_ids]
        if any(c is None for c in path_calls):
            left_out["call_gone"] += 1
            continue
        paths = [
            p
            for p in branches([c for c in path_calls if c is not None])
            if trajectory_id(p[-1][0].id, p[-1][1] or 0) == item.trajectory_id
        ]
        traj = build_trajectory(paths[0], end_of_turn=eot.get(item.session_id, ())) if paths else None
        if traj is None or digest(traj) != item.digest:
            left_out["changed"] += 1
            continue
        traj.reward, traj.reward_detail = item.reward, {**item.reward_detail, "dataset": name}
        out.append(traj)
    return calls, out, left_out


@dataclass
class DatasetFeed:
    """The trainer's loader for ``train --dataset``: the dataset's trainable items, ``limit`` per poll, once each.

    Held-out ("eval"), ungraded, masked and unusable items are left out as everywhere, and items
    of another alias (their behaviour logprobs are another adapter's); all counted at the first poll.
    Items are trained whatever this alias trained before: a dataset is a deliberate choice.
    """

    project: str
    alias: str
    name: str
    limit: int = 32
    queue: list[Trajectory] | None = None  # None: not read yet

    def __call__(self, db: DbSession, project: str, alias: str) -> tuple[list[Trajectory], Counter[str]]:
        if (project, alias) != (self.project, self.alias):
            raise ValueError(f"this feed reads {self.project}/{self.alias}, not {project}/{alias}")
        said = Counter[str]()
        if self.queue is None:
            _, trajectories, said = pinned(db, self.project, self.name)
            self.queue = []
            for traj in trajectories:
                reason = Exclusion.OTHER_ALIAS if traj.alias != self.alias else training_exclusion(traj, ())
                if reason is None:
                    self.queue.append(traj)
                else:
                    said[reason] += 1
        batch, self.queue = self.queue[: self.limit], self.queue[self.limit :]
        return batch, said
