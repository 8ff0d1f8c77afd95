"""An incremental reader of the change log: what changed since its cursor, one backlog entry per session.

The shared part of the trainer's two loaders (scored trajectories, :mod:`storage.feed`;
text-feedback examples, :mod:`trainer.textual_load`). A subclass names its consumer
(its row in ``change_cursors``), says what its items depend on besides the log
(:meth:`ChangeReader.config`) and rebuilds the sessions a poll touched
(:meth:`ChangeReader.read`); this class does the rest:

* each poll reads the log after its position (a few pages at most), asks ``read`` for
  the items of the sessions those changes touched, and keeps them in a backlog, one
  entry per session, replacing what that session had waiting;
* it hands out up to ``limit`` items, oldest change first, once ``min_batch`` wait, and
  removes them: the caller records what it used before it polls again;
* the position survives restarts: saved at the start of each poll as the settled point,
  just before the oldest session still waiting, else everything read. A restarted
  reader re-reads at most the waiting sessions (and ``read`` leaves out what was used);
* a delete (a ``deletion`` entry, :func:`storage.changes.log_deletion`) touches its session: read
  again, it has nothing left but what was recorded after the delete. Before each hand-out the reader
  also asks for deletion entries of the sessions it holds beyond its position (:func:`deleted_after`:
  entries it has not reached, or that are not final yet) and re-reads those first, so nothing
  deleted before the poll is handed out however far behind the reader is;
* when ``config`` changes (the reward rule, the judge's verdict, a project setting the
  items depend on) every item may differ: the reader starts again from the beginning
  of the log, a page at a time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, TypeVar

from sqlalchemy.orm import Session as DbSession

from storage.changes import (
    START,
    Position,
    await_horizon,
    changes_since,
    deleted_after,
    load_cursor,
    save_cursor,
    touched_sessions,
)

T = TypeVar("T")  # what the reader hands out
C = TypeVar("C")  # what its items depend on besides the log


@dataclass
class Waiting(Generic[T]):
    """A session's items not handed out yet, and the position of its newest change when it was read."""

    position: Position
    items: list[T]


@dataclass
class ChangeReader(Generic[T, C]):
    """Base of the incremental loaders; subclasses define :attr:`consumer`, :meth:`config` and :meth:`read`."""

    project: str
    _: KW_ONLY
    limit: int = 32  # items handed out per poll
    min_batch: int = 1  # hand out nothing until this many are waiting
    page: int = 2000  # changes read per query
    pages: int = 8  # queries per poll at most: a long catch-up is spread over polls
    settle_s: float = 10.0  # how long a poll waits for committed changes held back by an older transaction
    position: Position | None = None  # None: load the saved cursor at the first poll
    saved: Position | None = None
    backlog: dict[str, Waiting[T]] = field(default_factory=dict)
    last_config: C | None = None
    sessions_read: int = 0  # sessions rebuilt by the last poll (what a poll costs follows this, not the history)

    @property
    def consumer(self) -> str:
        raise NotImplementedError

    def config(self, db: DbSession) -> C:
        """What the items depend on besides the log; when it changes the reader starts again."""
        raise NotImplementedError

    def read(self, db: DbSession, sessions: dict[str, Position], config: C) -> tuple[dict[str, list[T]], Counter[str]]:
        """The items of these sessions still to hand out (never one already used), and exclusions by reason."""
        raise NotImplementedError

    @property
    def waiting(self) -> int:
        return sum(len(w.items) for w in self.backlog.values())

    def poll(self, db: DbSession) -> tuple[list[T], Counter[str]]:
        """Read what changed (a few pages at most), then hand out up to ``limit`` items.

        The exclusions are those of the sessions read in this poll (what changed), not of the whole history.
        """
        if self.position is None:  # no saved cursor: its row is written now, pinning the log (changes.prune_changes)
            self.saved = load_cursor(db, self.project, self.consumer)
            self.position = self.saved or START
        self._save(db)
        config = self.config(db)
        if self.last_config is not None and config != self.last_config:
            self.position, self.backlog = START, {}  # every item may differ: read the log again
        self.last_config = config
        excluded: Counter[str] = Counter()
        self.sessions_read = 0
        await_horizon(db, self.project, self.settle_s)
        for _ in range(self.pages):
            if self.waiting >= 4 * self.limit:
                break  # enough waiting: read more once the caller has taken some
            changes = changes_since(db, self.project, self.position, self.page)
            if not changes:
                break
            self.position = changes[-1].position
            excluded += self._read(db, touched_sessions(db, self.project, changes), config)
            if len(changes) < self.page:
                break
        excluded += self._reread_deleted(db, config)
        return self._hand_out(), excluded

    def _reread_deleted(self, db: DbSession, config: C) -> Counter[str]:
        """Re-read the waiting sessions deleted beyond this reader's position (it has not reached the entry)."""
        if not self.backlog:
            return Counter()
        assert self.position is not None
        gone = deleted_after(db, self.project, list(self.backlog), self.position)
        return self._read(db, {s: self.backlog[s].position for s in gone}, config)

    def _read(self, db: DbSession, sessions: dict[str, Position], config: C) -> Counter[str]:
        if not sessions:
            return Counter()
        self.sessions_read += len(sessions)
        items, excluded = self.read(db, sessions, config)
        for session_id, at in sessions.items():
            if items.get(session_id):
                self.backlog[session_id] = Waiting(at, items[session_id])
            else:
                self.backlog.pop(session_id, None)  # nothing left to hand out there
        return excluded

    def _hand_out(self) -> list[T]:
        if self.waiting < self.min_batch:
            return []
        out: list[T] = []
        for session_id, waiting in sorted(self.backlog.items(), key=lambda kv: kv[1].position):
            take = waiting.items[: self.limit - len(out)]
            out += take
            waiting.items = waiting.items[len(take) :]
            if not waiting.items:
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
