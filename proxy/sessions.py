"""Sessions and tasks: named by the harness, or linked by message prefixes.

A call continues the recorded call whose *link key* (:mod:`proxy.link_keys`: its
request messages plus the assistant message it returned) is the longest of the
call's own message prefixes.

Everything about finding a call's session is here: :class:`Linker` looks in this
worker's memory, then in sibling workers' link indexes (calls not yet drained), then
in the database (recorded calls, and other hosts' link entries: :mod:`proxy.link_feed`), which it
asks again for a moment when another host may have answered the parent (:data:`LINK_WAIT_S`).
A prefix the database had no parent for is not asked about again for a few seconds
(:data:`MISS_TTL_S`): a prompt whose assistant turns no recorded call returned (few-shot
examples, a history brought from elsewhere) would otherwise cost every call a query.

Linking never crosses callers: the key chain starts from a *scope*
(:func:`proxy.link_keys.link_scope`), the API key and the end user the client names
(``user``, ``metadata.user_id``, ``metadata.end_user``), so two users of one harness
with a fixed opening never share a key, even when greedy decoding gives them the same
first reply. Within a scope, a key two sessions produced is *ambiguous*: a call
continuing it is not linked but starts a new session with source ``ambiguous_link``.
Memory and the database judge ambiguity; a sibling's link index's first match is taken as found.

A deleted session (or end user) is never a parent again: the worker that took the delete
forgets it at once, every other one when it reads the delete's entry in the change log
(:class:`proxy.link_deletes.Deletes`); from then on its links in memory are gone,
and calls of it made before this worker learned of the delete, still in a sibling's spool
or answered while the delete ran, are not taken as parents. A later call of that id starts
afresh and links as usual.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.dialects.base import Stored
from proxy.dialects.lookup import RecentCalls, find, id_needle
from proxy.link_deletes import Deletes
from proxy.link_feed import Entry, LinkFeed, Listener, young_entries
from proxy.link_keys import Naming
from proxy.spool import Spool
from storage.models import Completion


def new_session_id() -> str:
    return "ses_" + os.urandom(16).hex()


@dataclass(frozen=True)
class Link:
    session_id: str
    completion_id: str
    task_id: str | None
    end_user: str | None = None  # the stored key of the caller (storage.records.end_user_key)
    created_at: str | None = None  # when the call was made (ISO 8601): deletes apply to earlier calls


AMBIGUOUS = Link("", "", None)  # a key more than one session produced: which one goes on is unknowable

# How long the database's "no parent" for a prefix is believed. Only a call resending that very prefix
# reads it: a later turn's longest prefix is a new key (the reply it continues was recorded here, or is
# looked up afresh). What it can miss is a parent recorded by another host in these seconds, for a
# retry of the call that missed it; that retry then starts its own session, as the call it repeats did.
MISS_TTL_S = 5.0
# A lookup the database did not answer (within LOOKUP_S: down, or unreachable behind a partition, where a
# connect hangs) leaves it alone this long: linking uses memory and spools, and calls do not each wait.
LOOKUP_S = 1.0
QUIET_S = 5.0
# Several hosts on one database: a turn sent milliseconds after its parent's reply ended, to another host
# than the one that answered it, finds the parent nowhere yet (that host's memory and spool are its own; its
# recorder moves the record into the database within about 50 ms, longer under load). A call with an
# assistant turn found nowhere asks the database again, with the other waiting calls, every POLL_S for up
# to LINK_WAIT_S before it starts a new session. Only such calls wait, and only while another host is live
# on the database (Linker.other_hosts: hosts counted from their presence rows, proxy/ratelimit.py); a
# history brought from elsewhere (few-shot turns) pays it once (then MISS_TTL_S). ONTHEJOB_LINK_WAIT_S=0: off.
LINK_WAIT_S = float(os.environ.get("ONTHEJOB_LINK_WAIT_S", "3.0"))
POLL_S = 0.025  # one query for every call waiting on this worker, this often


class LinkCache:
    """Recent link keys in memory: (project, key) → the sessions that produced it (a few, newest last).

    A named session finds its own link under a key whatever other sessions produced it;
    an unnamed call gets AMBIGUOUS when more than one did. The database answers the rest.
    """

    PER_KEY = 4  # sessions kept per key; more only confirm the key is ambiguous

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], dict[str, Link]] = OrderedDict()

    def put(self, project: str, key: str, link: Link) -> None:
        links = self._items.get((project, key))
        if links is None:
            links = self._items[(project, key)] = {}
        links.pop(link.session_id, None)
        links[link.session_id] = link
        if len(links) > self.PER_KEY:
            del links[next(iter(links))]
        self._items.move_to_end((project, key))
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def forget(self, project: str, sessions: set[str], end_users: set[str]) -> int:
        """Drop every link of these sessions, and of these end users' calls; how many keys lost one.

        A scan of the whole cache: deletes are rare, and a per-call index would cost every call.
        """
        lost = 0
        for (p, key), links in list(self._items.items()):
            if p != project:
                continue
            gone = [s for s, link in links.items() if s in sessions or link.end_user in end_users]
            for session_id in gone:
                del links[session_id]
            lost += bool(gone)
            if not links:
                del self._items[(p, key)]
        return lost

    def longest(self, project: str, keys: list[str], session: str | None) -> Link | None:
        """The link for the longest prefix we know (within ``session`` if given), or AMBIGUOUS."""
        return self.longest_at(project, keys, session)[1]

    def longest_at(self, project: str, keys: list[str], session: str | None) -> tuple[int, Link | None]:
        """(index in ``keys``, link) of the longest prefix we know; (-1, None) when none is known."""
        for i in range(len(keys) - 1, -1, -1):
            links = self._items.get((project, keys[i]))
            if not links:
                continue
            if session is not None:
                if session in links:
                    return i, links[session]
                continue
            return i, AMBIGUOUS if len(links) > 1 else next(iter(links.values()))
        return -1, None


@dataclass(frozen=True, slots=True)
class SessionRef:
    """The session a call belongs to, and how it was found."""

    id: str
    source: str  # header | metadata | path | linked | new
    parent_id: str | None  # the completion this call continues (linked by messages)
    task_id: str | None


class Linker:
    """Finds the session a call continues: this worker's memory, sibling spools, then the database."""

    def __init__(
        self,
        spool: Spool,
        sessionmaker: async_sessionmaker[AsyncSession],
        size: int = 100_000,
        miss_ttl_s: float = MISS_TTL_S,
        quiet_s: float = QUIET_S,
        wait_s: float = LINK_WAIT_S,
    ) -> None:
        self.spool = spool
        self.sessionmaker = sessionmaker
        self.cache = LinkCache(size)
        self.recent = RecentCalls()  # this worker's dialect calls by id, for continuations
        self.miss_ttl_s = miss_ttl_s
        # (project, session asked within, longest prefix key) → when the database's "none" expires. The
        # longest key stands for all the call's candidates: each key chains the ones before it.
        self._misses: OrderedDict[tuple[str, str | None, str], float] = OrderedDict()
        self._misses_size = size // 10
        self.quiet_s = quiet_s
        self._quiet_until = 0.0  # no lookups before this (the last one failed)
        self.deletes = Deletes(sessionmaker, self.cache.forget)  # what this worker knows was deleted
        self.wait_s = wait_s
        # Whether another host shares the database (then a parent found nowhere is waited for): one host unless
        # told (proxy/state.py counts the rate-limit leases' presence rows). While one is, this worker's calls'
        # link keys go to the database at once and lookups read the others' (proxy/link_feed.py; None: SQLite).
        self.other_hosts: Callable[[], bool] = lambda: False
        self.feed: LinkFeed | None = None
        self.listener: Listener | None = None  # wakes the waiting calls' poll when another host wrote entries
        self.waits = 0  # polls of the database for calls waiting on another host's parent
        self._waiters: list[_Waiter] = []
        self._poller: asyncio.Task[None] | None = None
        # Calls with an earlier assistant turn, by where their parent was found: memory, spool (a sibling
        # worker's), database, link_entry (another host's call not landed yet), none (asked, not found),
        # believed_none (a recent "none"), database_down (no answer), database_quiet (not asked: see quiet_s).
        self.lookups: dict[str, int] = {}
        self.waited: dict[str, float] = {}  # seconds calls waited for another host's parent, by where it was found

    @property
    def db_lookups(self) -> int:
        """Queries sent to the database for a parent (answered or not)."""
        return sum(self.lookups.get(found, 0) for found in ("database", "link_entry", "none", "database_down"))

    async def find_call(self, project: str, call_id: str) -> Stored | None:
        """A stored call by id (a dialect's ``previous_response_id``): memory, the spools, database.

        A call of a session deleted since it was made is not found (it never lands, or was removed).
        """
        found = await find(
            project,
            call_id,
            recent=self.recent,
            spools=partial(self.spool.sibling_matching, own=True),
            sessionmaker=self.sessionmaker,
        )
        if found is None or not self.deletes.known(project, found.session_id):
            return found
        for record in self.spool.sibling_matching([id_needle(call_id)], own=True):  # not drained yet: its time
            if record.id == call_id:
                return None if self.deletes.gone(project, record.session_id, None, record.created_at) else found
        query = select(Completion.id).where(Completion.project_id == project, Completion.id == call_id)
        async with asyncio.timeout(5.0), self.sessionmaker() as db:  # drained: stored only if made after the delete
            return found if await db.scalar(query) is not None else None

    async def resolve(
        self, project: str, naming: Naming, messages: list[dict[str, Any]] | None, keys: list[str]
    ) -> SessionRef:
        """The session of a call with these request ``messages`` (``keys``: their :func:`prefix_keys`)."""
        link = None
        if messages:
            # A parent's link key always ends with the assistant message it returned.
            candidates = [k for k, m in zip(keys, messages, strict=True) if m.get("role") == "assistant"]
            if candidates:
                at, link = self.cache.longest_at(project, candidates, naming.session_id)
                found = "memory"
                # The turns after the one memory knows (all of them when it knows none) were answered
                # elsewhere: by a sibling worker (its spool), another host (the database, once drained), or
                # by no recorded call (a history brought from elsewhere, an edited reply).
                longer = candidates[at + 1 :]
                if longer:
                    miss = (project, naming.session_id, candidates[-1])
                    if self._missed(miss):
                        found = found if link is not None else "believed_none"
                    else:
                        far, where = self._spool_link(project, longer, naming.session_id), "spool"
                        if far is None:
                            far, where = await self._db_link(project, longer, naming.session_id, miss)
                        if far is not None:
                            link, found = far, where
                        elif link is None:
                            found = where
                self.lookups[found] = self.lookups.get(found, 0) + 1
        if link is AMBIGUOUS:
            return SessionRef(new_session_id(), "ambiguous_link", None, naming.task_id)
        task = naming.task_id or (link.task_id if link else None)
        if naming.session_id:
            return SessionRef(naming.session_id, naming.source, link.completion_id if link else None, task)
        if link is not None:
            return SessionRef(link.session_id, "linked", link.completion_id, task)
        return SessionRef(new_session_id(), "new", None, task)

    def remember(self, project: str, keys: list[str | None], link: Link) -> None:
        """A recorded call's link keys (one per choice), for the follow-ups this worker serves."""
        if self.deletes.gone(project, link.session_id, link.end_user, link.created_at):
            return  # answered while its session was deleted: it never lands, nothing continues it
        shared = self.feed is not None and self.other_hosts()
        for key in keys:
            if key:
                self.cache.put(project, key, link)
                if shared and self.feed is not None:
                    self.feed.put(project, key, link)

    def _spool_link(self, project: str, keys: list[str], session: str | None) -> Link | None:
        for entry in self.spool.sibling_links(keys[::-1]):  # the longest prefix first
            if entry.project_id == project and session in (None, entry.session_id):
                if self.deletes.gone(project, entry.session_id, entry.end_user, entry.created_at):
                    continue
                return Link(entry.session_id, entry.id, entry.task_id, entry.end_user, entry.created_at)
        return None

    def _missed(self, miss: tuple[str, str | None, str]) -> bool:
        """Whether the database found no parent for this prefix in the last :attr:`miss_ttl_s` seconds."""
        until = self._misses.get(miss)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._misses[miss]
        return False

    async def _db_link(
        self, project: str, keys: list[str], session: str | None, miss: tuple[str, str | None, str]
    ) -> tuple[Link | None, str]:
        """The parent the database knows, and where it was found (:attr:`lookups`' names)."""
        if time.monotonic() < self._quiet_until:
            return None, "database_quiet"
        try:
            if self.wait_s > 0 and self.other_hosts():
                started = time.monotonic()
                rows = await self._wait_for(project, session, keys)
                where = "none" if not rows else "link_entry" if any(isinstance(r, Entry) for r in rows) else "database"
                self.waited[where] = self.waited.get(where, 0.0) + time.monotonic() - started
            else:
                rows = await self._query(project, session, keys)
        except Exception:  # noqa: BLE001 - database down: link from memory only; the call still goes through
            self._quiet_until = time.monotonic() + self.quiet_s
            return None, "database_down"
        rank = {k: i for i, k in enumerate(keys)}
        best = max(rows, key=lambda r: rank[r.link_key], default=None)
        if best is None:  # believed a few seconds
            self._misses[miss] = time.monotonic() + self.miss_ttl_s
            if len(self._misses) > self._misses_size:
                self._misses.popitem(last=False)
            return None, "none"
        if len({r.session_id for r in rows if r.link_key == best.link_key}) > 1:
            return AMBIGUOUS, "database"
        return Link(best.session_id, best.id, best.task_id), "link_entry" if isinstance(best, Entry) else "database"

    async def _query(self, project: str, session: str | None, keys: list[str], limit: int = 50) -> list[Any]:
        """The recorded calls whose link key is one of ``keys`` (within ``session`` if given), newest first;
        while another host is live, then the calls the hosts answered that have not landed yet (their link
        entries, proxy/link_feed.py), but those of sessions this worker knows were deleted."""
        query = select(Completion.id, Completion.session_id, Completion.task_id, Completion.link_key).where(
            Completion.project_id == project, Completion.link_key.in_(keys)
        )
        if session:
            query = query.where(Completion.session_id == session)
        async with asyncio.timeout(LOOKUP_S), self.sessionmaker() as db:
            rows: list[Any] = list((await db.execute(query.order_by(Completion.created_at.desc()).limit(limit))).all())
            if self.feed is None or not self.other_hosts():
                return rows
            entries = await young_entries(db, project, session, keys, limit)
        seen = {r.id for r in rows}
        return rows + [
            e
            for e in entries
            if e.id not in seen and not self.deletes.gone(project, e.session_id, e.end_user, e.created_at)
        ]

    async def _wait_for(self, project: str, session: str | None, keys: list[str]) -> list[Any]:
        """The rows for ``keys``, once another host's recorder has moved them here; none after :attr:`wait_s`.

        One poller per worker asks for every waiting call's keys in one query, at once and then every
        :data:`POLL_S`: calls of many conversations at once cost the database one query a tick, not one each.
        A query that fails or times out (the database down, or slow under load) is retried while the call
        may still wait; after its wait the call takes the failure (then :attr:`quiet_s` of no lookups).
        """
        loop = asyncio.get_running_loop()
        waiter = _Waiter(project, session, keys, time.monotonic() + self.wait_s, loop.create_future())
        self._waiters.append(waiter)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        return await waiter.rows

    async def _poll(self) -> None:
        while self._waiters:
            if self.listener is not None:
                self.listener.arrived.clear()  # before the query: entries written during it wake the next one
            groups: dict[tuple[str, str | None], list[_Waiter]] = {}
            for waiter in self._waiters:
                groups.setdefault((waiter.project, waiter.session), []).append(waiter)
            for (project, session), waiters in groups.items():
                wanted = sorted({k for w in waiters for k in w.keys})
                rows, failure = [], None
                try:
                    rows = await self._query(project, session, wanted, limit=50 * len(waiters))
                except Exception as exc:  # noqa: BLE001 - retried while the calls may wait
                    failure = exc
                now = time.monotonic()
                for waiter in waiters:
                    if waiter.rows.done():  # the call was cancelled
                        continue
                    mine = [r for r in rows if r.link_key in waiter.keys]
                    waiter.failure = failure  # the latest poll's: one that answered clears an earlier failure
                    if mine:
                        waiter.rows.set_result(mine)
                    elif now >= waiter.deadline:
                        if waiter.failure is not None:
                            waiter.rows.set_exception(waiter.failure)
                        else:
                            waiter.rows.set_result([])
            self._waiters = [w for w in self._waiters if not w.rows.done()]  # answered, timed out or cancelled
            if self._waiters:
                if self.listener is not None:  # sooner when another host wrote link entries
                    await self.listener.pause(POLL_S)
                else:
                    await asyncio.sleep(POLL_S)
                self.waits += 1


@dataclass
class _Waiter:
    """A call waiting for its parent to reach the database from another host."""

    project: str
    session: str | None
    keys: list[str]
    deadline: float
    rows: asyncio.Future[list[Any]]
    failure: Exception | None = None  # the last failed poll, if any: raised if the wait ends with no rows
