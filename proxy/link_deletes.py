"""What a worker knows was deleted, for linking: a deleted session (or end user) is never a parent again.

The worker that took a delete tells its :class:`Deletes` at once (proxy/routes_admin.py); every
worker reads the change log's deletion entries (storage/changes.py, the one way a delete reaches
what holds copies) every :data:`FOLLOW_S` (:meth:`Deletes.follow`, started with the worker), each
as soon as it is committed. Each
delete drops the links in memory of what it names (the link cache's ``forget``), and is remembered
with the time this worker learned of it: a call of it made no later than that, still in a sibling's
spool or answered while the delete ran, is not taken as a parent nor remembered as one. A call made
afterwards (a harness reusing ``customer-42``) starts the session afresh and links as usual.

Both clocks here are this host's (the worker's when it learned, the proxy's when a call was made):
no database time is compared, so skew between hosts does not enter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.changes import START, Deletion, Position, deletions_since, horizon, latest_deletion

FOLLOW_S = 1.0  # how often a worker reads the change log's deletion entries
KEPT = 10_000  # deletes remembered (per kind), for calls of them still in spools
READ_S = 5.0  # a round the database does not answer in this long is given up (the next one reads it)


class Deletes:
    """Deleted sessions and end users this worker knows of; ``forget_links(project, sessions, end_users)``
    drops the links in memory (:meth:`proxy.sessions.LinkCache.forget`)."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], forget_links: Callable[[str, set[str], set[str]], Any]
    ) -> None:
        self.sessionmaker = sessionmaker
        self.forget_links = forget_links
        # (project, session) and (project, end user key) → when this worker learned of the delete (its clock).
        self._sessions: OrderedDict[tuple[str, str], datetime] = OrderedDict()
        self._users: OrderedDict[tuple[str, str], datetime] = OrderedDict()
        self.position: Position | None = None  # the last final deletion entry read; None: not started
        self._seen: set[Position] = set()  # entries after it applied already (committed, not final yet)
        self.applied = 0  # deletes applied (from the log or this worker's own routes)

    def forget(self, project: str, sessions: Iterable[str] = (), end_users: Iterable[str] = ()) -> None:
        """A delete of these sessions (and end users: their stored keys): none of their calls so far is a parent."""
        now, names, users = datetime.now(UTC), set(sessions), set(end_users)
        for table, keys in ((self._sessions, names), (self._users, users)):
            for name in keys:
                table[(project, name)] = now
                table.move_to_end((project, name))
                while len(table) > KEPT:
                    table.popitem(last=False)
        self.forget_links(project, names, users)
        self.applied += 1

    def apply(self, deletions: Iterable[Deletion]) -> None:
        """Deletion entries of the change log: one :meth:`forget` per project (each scans the link cache once)."""
        by_project: dict[str, tuple[set[str], set[str]]] = {}
        for d in deletions:
            sessions, users = by_project.setdefault(d.project_id, (set(), set()))
            if d.session_id is not None:
                sessions.add(d.session_id)
            if d.end_user is not None:
                users.add(d.end_user)
        for project, (sessions, users) in by_project.items():
            self.forget(project, sessions, users)

    def known(self, project: str, session: str) -> bool:
        """Whether this worker knows of a delete of ``session``."""
        return (project, session) in self._sessions

    def gone(self, project: str, session: str, end_user: str | None, made: str | None) -> bool:
        """Whether a call of ``session`` (by ``end_user``; made at ``made``, ISO 8601) predates a delete we know of."""
        learned = self._sessions.get((project, session))
        if learned is None and end_user is not None:
            learned = self._users.get((project, end_user))
        return learned is not None and (made is None or datetime.fromisoformat(made) <= learned)

    async def follow(self, every_s: float = FOLLOW_S) -> None:
        """Read the deletion entries of every project forever."""
        while True:
            with contextlib.suppress(Exception):  # the database down: the next round reads what was missed
                await self.follow_once()
            await asyncio.sleep(every_s)

    async def follow_once(self) -> int:
        """Apply the deletion entries committed since the last round; how many. The first round starts at the
        newest final one (nothing was cached before this worker started).

        Entries are applied as soon as they are committed, not held back by an older transaction still in
        flight (one idle in a transaction anywhere would delay every worker): those above the horizon are
        remembered as applied and read again, unapplied, until the position can pass them.
        """
        async with asyncio.timeout(READ_S), self.sessionmaker() as db:
            if self.position is None:
                self.position = await db.run_sync(latest_deletion)
                return 0
            cursor = self.position

            def read(s: Any) -> tuple[int | None, list[Deletion]]:
                bound = horizon(s)  # first: every transaction below it has finished, its entries are seen below
                return bound, deletions_since(s, cursor or START, final=False)

            bound, deletions = await db.run_sync(read)
        new = [d for d in deletions if d.position not in self._seen]
        self.apply(new)
        self._seen |= {d.position for d in new}
        final = [d for d in deletions if bound is None or d.position.xid < bound]  # a prefix: ordered by xid
        if final:
            self.position = final[-1].position
            self._seen = {p for p in self._seen if p > self.position}
        return len(new)
