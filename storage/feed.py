"""The trainer's batch loader: what changed since its cursor, not the alias's whole history.

Each poll reads the change log after the feed's position, rebuilds only the sessions
those changes touched (a new call, a new or revised grade, a comment), grades them and
keeps their trainable part (:mod:`storage.used`) in a backlog, one entry per session.
A session that is ungraded, held out ("eval") or trained already is read once and left
alone until it changes again. Paging, the backlog, the hand-out and the saved cursor
(consumer ``train:<alias>``) are :class:`storage.change_reader.ChangeReader`'s: a
restarted trainer re-reads at most the sessions still waiting. When the project's
reward rule changes (its settings, or its judge passing or failing the agreement
gate) every grade may change: the feed starts again from the beginning of the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage.change_reader import ChangeReader
from storage.changes import Position
from storage.grading import RewardRule
from storage.loaders import build, feedback_listed_stmt, project_rule
from storage.models import Completion
from storage.trajectories import Render, Trajectory
from storage.used import prefix_ids, screen_batch, used_keys


@dataclass
class TrainingFeed(ChangeReader[Trajectory, RewardRule]):
    """Callable as the runner's loader: ``feed(db, project, alias) -> (trajectories, exclusions by reason)``."""

    alias: str
    render: Render | None = None
    end_of_turn: Collection[int] | None = None

    @property
    def consumer(self) -> str:
        return f"train:{self.alias}"

    def __call__(self, db: DbSession, project: str, alias: str) -> tuple[list[Trajectory], Counter[str]]:
        if (project, alias) != (self.project, self.alias):
            raise ValueError(f"this feed reads {self.project}/{self.alias}, not {project}/{alias}")
        return self.poll(db)

    def config(self, db: DbSession) -> RewardRule:
        """The reward rule, told whether the judge passes its gate: every grade depends on it."""
        return project_rule(db, self.project)

    def read(
        self, db: DbSession, sessions: dict[str, Position], rule: RewardRule
    ) -> tuple[dict[str, list[Trajectory]], Counter[str]]:
        """Rebuild these sessions; their trainable trajectories of this alias, by session."""
        ids = list(sessions)
        calls = list(
            db.scalars(
                select(Completion)
                .where(Completion.project_id == self.project, Completion.session_id.in_(ids))
                .order_by(Completion.session_id, Completion.created_at, Completion.id)
            )
        )
        requests = [c.client_request_id for c in calls if c.client_request_id]
        feedback = list(db.scalars(feedback_listed_stmt(self.project, ids, [c.id for c in calls], requests)))
        trajectories = build(calls, feedback, rule=rule, render=self.render, end_of_turn=self.end_of_turn)
        used = used_keys(db, self.project, self.alias, (i for t in trajectories for i in prefix_ids(t)))
        batch, excluded = screen_batch(trajectories, self.alias, used)
        by_session: dict[str, list[Trajectory]] = {}
        for traj in batch:
            by_session.setdefault(traj.session_id, []).append(traj)
        return by_session, excluded
