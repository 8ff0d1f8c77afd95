"""The link keys of the calls this worker answered, written to the database for the other hosts.

Several hosts behind one balancer: an agent harness sends its next turn milliseconds after the
previous reply ended, possibly to the other host. That host finds the parent neither in its memory
nor its own spools, and the parent's row reaches ``completions`` only when the answering host's
recorder moves it there (its drain every 50 ms, then its transaction), so the turn waits for it
(:data:`proxy.sessions.LINK_WAIT_S`). This feed shortens that wait: every call the worker records
(:meth:`proxy.sessions.Linker.remember`, before the reply's last byte) also queues its link keys
here, and one task writes whatever is queued in one ``INSERT`` into ``link_entries`` as soon as
the previous write is done. The other host's lookup reads those rows beside ``completions``.

A call never waits for it: :meth:`LinkFeed.put` appends to a bounded queue (the oldest dropped
and counted when full), a write that fails is dropped and counted (the recorder's rows arrive
anyway, only later). Only while another host is live (the rate-lease presence rows,
proxy/ratelimit.py): one host writes nothing. Rows are a bridge: read while younger than
:data:`READ_S`, pruned by the host that wrote them after :data:`KEEP_S`, deleted with their
sessions and end users (storage/deletion.py). A row of a session this worker knows was deleted is
not written; one of a session deleted elsewhere is not taken as a parent once the reader knows
(:class:`proxy.link_deletes.Deletes`), as for sibling spools.

On Postgres each write also sends ``NOTIFY onthejob_links`` (delivered at its commit), and every
worker keeps one connection listening (:class:`Listener`): a call waiting for another host's parent
is looked up again as soon as any host wrote entries, not at the next 25 ms poll
(:data:`proxy.sessions.POLL_S`, which stays as the fallback when the listener is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.db import insert_for
from storage.models import LinkEntry

log = logging.getLogger("onthejob.link_feed")

READ_S = 30.0  # rows younger than this are read; by then the recorder's rows have long taken over
KEEP_S = 60.0  # this host's rows older than this are deleted
PRUNE_EVERY_S = 10.0
CAP = 10_000  # entries queued at most (a database slower than the traffic: the oldest are dropped)
WRITE_TIMEOUT_S = 2.0
CHANNEL = "onthejob_links"  # NOTIFY'd by every write (Postgres)
MIN_PAUSE_S = 0.003  # waiting calls are looked up again this soon after a query at the earliest


class LinkFeed:
    """One worker's queue of link entries and the task that writes them (:meth:`run`)."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], host_id: str, cap: int = CAP) -> None:
        self.sessionmaker = sessionmaker
        self.host_id = host_id
        self.cap = cap
        self.queue: deque[dict[str, Any]] = deque()
        self.wake = asyncio.Event()
        self.written = 0
        self.dropped = 0  # queue full
        self.failed = 0  # in a write the database refused or did not answer
        self._pruned = 0.0

    def put(self, project: str, key: str, link: Any) -> None:
        """Queue one call's link key (``link``: its :class:`proxy.sessions.Link`). Never blocks."""
        if len(self.queue) >= self.cap:
            self.queue.popleft()
            self.dropped += 1
        self.queue.append(
            {
                "project_id": project,
                "link_key": key,
                "call_id": link.completion_id,
                "session_id": link.session_id,
                "task_id": link.task_id,
                "end_user": link.end_user,
                "created_at": link.created_at,
            }
        )
        self.wake.set()

    async def run(self) -> None:
        """Write what is queued, one ``INSERT`` at a time, until cancelled."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch = list(self.queue)
            self.queue.clear()
            if batch:
                await self._write(batch)
            if time.monotonic() - self._pruned > PRUNE_EVERY_S:
                self._pruned = time.monotonic()
                await self._prune()

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        rows = [{**e, "host_id": self.host_id, "written_at": func.now()} for e in batch]
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S), self.sessionmaker() as db:
                dialect = db.get_bind().dialect.name
                await db.execute(insert_for(dialect)(LinkEntry).values(rows).on_conflict_do_nothing())
                if dialect == "postgresql":  # delivered at the commit, with the rows; the payload says who wrote
                    await db.execute(
                        text("SELECT pg_notify(:channel, :host)"), {"channel": CHANNEL, "host": self.host_id}
                    )
                await db.commit()
            self.written += len(rows)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the recorder's rows still arrive; the other host waits longer
            self.failed += len(rows)
            log.debug("link entries not written (%s): %d", exc.__class__.__name__, len(rows))

    async def _prune(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(WRITE_TIMEOUT_S), self.sessionmaker() as db:
                old = func.now() - timedelta(seconds=KEEP_S)
                await db.execute(delete(LinkEntry).where(LinkEntry.host_id == self.host_id, LinkEntry.written_at < old))
                await db.commit()


class Listener:
    """One connection per worker listening for ``NOTIFY onthejob_links``; another host's sets :attr:`arrived`.

    Its own host's writes are ignored (their parents are in this host's spools). Reconnects after a
    failure (backing off to 5 s); meanwhile waiting calls poll as before.
    """

    def __init__(self, url: str, host_id: str) -> None:
        self.url = url  # libpq form (postgresql://...)
        self.host_id = host_id
        self.arrived = asyncio.Event()
        self.notified = 0
        self.connected = False

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=5)
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.connected, delay = True, 0.2
                    async for note in conn.notifies():
                        if note.payload != self.host_id:
                            self.notified += 1
                            self.arrived.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database went away: poll meanwhile, reconnect later
                log.debug("link listener down (%s); retrying in %.1fs", exc.__class__.__name__, delay)
            self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def pause(self, at_most: float) -> None:
        """Between two lookups of waiting calls: until another host wrote entries, but at least
        :data:`MIN_PAUSE_S` (many writes at once cost a query per few ms, not one each) and at most ``at_most``
        (without a listening connection, always ``at_most``). The caller clears :attr:`arrived` before a lookup."""
        if not self.connected:
            await asyncio.sleep(at_most)
            return
        await asyncio.sleep(MIN_PAUSE_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, at_most - MIN_PAUSE_S)):
                await self.arrived.wait()


@dataclass(frozen=True, slots=True)
class Entry:
    """A young link entry, read as the ``completions`` row its call will be (what linking reads of one)."""

    id: str
    session_id: str
    task_id: str | None
    link_key: str
    end_user: str | None
    created_at: str | None


async def young_entries(
    db: AsyncSession, project: str, session: str | None, keys: list[str], limit: int
) -> list[Entry]:
    """The link entries of ``keys`` younger than :data:`READ_S` (within ``session`` if given)."""
    e = LinkEntry
    query = select(e.call_id, e.session_id, e.task_id, e.link_key, e.end_user, e.created_at).where(
        e.project_id == project, e.link_key.in_(keys), e.written_at > func.now() - timedelta(seconds=READ_S)
    )
    if session:
        query = query.where(e.session_id == session)
    return [Entry(*row) for row in (await db.execute(query.limit(limit))).all()]
