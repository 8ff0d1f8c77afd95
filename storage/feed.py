"""The trainer's batch loader: what changed since its cursor, not the alias's whole history.

Each poll reads the change log after the feed's position (:mod:`storage.changes`),
rebuilds only the sessions those changes touched (a new call, a new or revised grade,
a comment), grades them and keeps their trainable part (:mod:`storage.used`) in a
backlog, one entry per session. A session that is ungraded, held out ("eval") or
trained already is read once and left alone until it changes again. The poll hands
out up to ``limit`` trajectories from the backlog, oldest change first, and removes
them: the trainer records what it used before it polls again.

The position survives restarts in ``change_cursors`` (consumer ``train:<alias>``),
saved at the start of each poll as the settled point: just before the oldest
session still waiting in the backlog, else everything read. A restarted trainer
re-reads at most the waiting sessions. When the project's reward rule changes
(its settings, or its judge passing or failing the agreement gate) every grade may
change: the feed starts again from the beginning of the log, a page at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage.changes import START, Position, await_horizon, changes_since, load_cursor, save_cursor, touched_sessions
from storage.grading import RewardRule
from storage.loaders import build, feedback_listed_stmt, project_rule
from storage.models import Completion
from storage.trajectories import Render, Trajectory
from storage.used import prefix_ids, screen_batch, used_keys


@dataclass
class _Waiting:
    position: Position  # the newest change of the session when it was read
    trajectories: list[Trajectory]


@dataclass
class TrainingFeed:
    """Callable as the runner's loader: ``feed(db, project, alias) -> (trajectories, exclusions by reason)``.

    The exclusions are those of the sessions read in this poll (what changed), not of the whole history.
    """

    project: str
    alias: str
    limit: int = 32  # trajectories handed out per poll
    min_batch: int = 1  # hand out nothing until this many are waiting
    page: int = 2000  # changes read per query
    pages: int = 8  # queries per poll at most: a long catch-up is spread over polls
    settle_s: float = 10.0  # how long a poll waits for committed changes held back by an older transaction
    render: Render | None = None
    end_of_turn: Collection[int] | None = None
    position: Position | None = None  # None: load the saved cursor at the first poll
    backlog: dict[str, _Waiting] = field(default_factory=dict)
    rule: RewardRule | None = None
    saved: Position | None = None

    @property
    def consumer(self) -> str:
        return f"train:{self.alias}"

    @property
    def waiting(self) -> int:
        return sum(len(w.trajectories) for w in self.backlog.values())

    def __call__(self, db: DbSession, project: str, alias: str) -> tuple[list[Trajectory], Counter[str]]:
        if (project, alias) != (self.project, self.alias):
            raise ValueError(f"this feed reads {self.project}/{self.alias}, not {project}/{alias}")
        return self.poll(db)

    def poll(self, db: DbSession) -> tuple[list[Trajectory], Counter[str]]:
        """Read what changed (a few pages at most), then hand out up to ``limit`` trajectories."""
        if self.position is None:
            self.position = self.saved = load_cursor(db, self.project, self.consumer) or START
        self._save(db)
        rule = project_rule(db, self.project)
        if self.rule is not None and rule != self.rule:
            self.position, self.backlog = START, {}  # every grade may differ: read the log again
        self.rule = rule
        excluded: Counter[str] = Counter()
        await_horizon(db, self.project, self.settle_s)
        for _ in range(self.pages):
            if self.waiting >= 4 * self.limit:
                break  # enough waiting: read more once the trainer has taken some
            changes = changes_since(db, self.project, self.position, self.page)
            if not changes:
                break
            self.position = changes[-1].position
            excluded += self._read(db, touched_sessions(db, self.project, changes), rule)
            if len(changes) < self.page:
                break
        return self._hand_out(), excluded

    def _read(self, db: DbSession, sessions: dict[str, Position], rule: RewardRule) -> Counter[str]:
        """Rebuild these sessions; the backlog keeps their trainable trajectories of this alias."""
        if not sessions:
            return Counter()
        ids = list(sessions)
        calls = list(db.scalars(
            select(Completion).where(Completion.project_id == self.project, Completion.session_id.in_(ids))
            .order_by(Completion.session_id, Completion.created_at, Completion.id)
        ))  # fmt: skip
        requests = [c.client_request_id for c in calls if c.client_request_id]
        feedback = list(db.scalars(feedback_listed_stmt(self.project, ids, [c.id for c in calls], requests)))
        trajectories = build(calls, feedback, rule=rule, render=self.render, end_of_turn=self.end_of_turn)
        used = used_keys(db, self.project, self.alias, (i for t in trajectories for i in prefix_ids(t)))
        batch, excluded = screen_batch(trajectories, self.alias, used)
        by_session: dict[str, list[Trajectory]] = {}
        for traj in batch:
            by_session.setdefault(traj.session_id, []).append(traj)
        for session_id, at in sessions.items():
            if session_id in by_session:
                self.backlog[session_id] = _Waiting(at, by_session[session_id])
            else:
                self.backlog.pop(session_id, None)  # nothing left to train there (or not this alias's)
        return excluded

    def _hand_out(self) -> list[Trajectory]:
        if self.waiting < self.min_batch:
            return []
        out: list[Trajectory] = []
        for session_id, waiting in sorted(self.backlog.items(), key=lambda kv: kv[1].position):
            take = waiting.trajectories[: self.limit - len(out)]
            out += take
            waiting.trajectories = waiting.trajectories[len(take) :]
            if not waiting.trajectories:
                del self.backlog[session_id]
            if len(out) >= self.limit:
                break
        return out

    def settled(self) -> Position:
        """Where a restart may resume: before the oldest session still waiting, else everything read."""
        assert self.position is not None
        if not self.backlog:
            return self.position
        return min(w.position for w in self.backlog.values()).before()

    def _save(self, db: DbSession) -> None:
        """Persist the settled position (what was handed out earlier is recorded as used by now)."""
        settled = self.settled()
        if settled != self.saved:
            save_cursor(db, self.project, self.consumer, settled)
            db.commit()
            self.saved = settled
