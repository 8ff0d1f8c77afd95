"""The write-behind recorder: spool segments → batched database inserts → delete after commit.

On Postgres a batch is one transaction on the recorder's own psycopg connection
(COPY, storage/bulk.py); elsewhere, and for a batch COPY refuses, SQLAlchemy inserts
it with ``ON CONFLICT DO NOTHING`` on our own ids, so a crash between the commit and
the segment's deletion replays it without duplicates.
While the database is down the spool grows and nothing is dropped; the recorder
retries with backoff and drains when it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import orjson
import psycopg
from sqlalchemy import delete, select
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.metrics import Metrics
from proxy.spool import Spool, read_segment
from storage import bulk
from storage.db import insert_for, libpq_url
from storage.deletion import Deleted, tombstoned_async
from storage.feedback import attach_pending
from storage.models import Completion, Project, Session, utcnow
from storage.records import CallRecord
from storage.stored_form import Encoder, add_prefixes, add_prefixes_pg, delta_enabled

log = logging.getLogger("onthejob.recorder")
# Errors about a record's content (not about reaching the database): retrying will not help.
POISON = (DataError, IntegrityError, TypeError, ValueError, KeyError)


class Recorder:
    def __init__(
        self, spool: Spool, sessionmaker: async_sessionmaker[AsyncSession], metrics: Metrics, batch: int = 500
    ) -> None:
        self.spool = spool
        self.sessionmaker = sessionmaker
        self.metrics = metrics
        self.batch = batch
        self.wake = asyncio.Event()
        self.db_ok = True
        self.written = 0
        self._projects: set[str] = set()
        # The delta form (storage/stored_form.py): children of calls this recorder committed store what is new.
        self.stored = Encoder() if delta_enabled() else None
        # On Postgres the recorder writes through its own psycopg connection (storage/bulk.py).
        url = getattr(sessionmaker.kw.get("bind"), "url", None)
        self._pg_url: str | None = (
            libpq_url(url.render_as_string(hide_password=False))
            if url is not None and url.get_backend_name() == "postgresql"
            else None
        )
        self._pg_conn: psycopg.AsyncConnection[Any] | None = None

    async def run(self) -> None:
        """Drain forever; back off while the database is down."""
        delay = 0.2
        while True:
            try:
                await self.drain_once()
                self.db_ok = True
                self.metrics.db_up.set(1)
                delay = 0.2
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can lose a cancellation that
                # arrives as the wait ends, and this loop would then outlive the app's stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await self.wake.wait()
                self.wake.clear()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any database failure: keep the spool, retry later
                self.db_ok = False
                self.metrics.db_up.set(0)
                log.warning(
                    "database write failed (%s); spool depth %d, retrying in %.1fs",
                    exc.__class__.__name__,
                    self.spool.depth,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                self.metrics.spool_depth.set(self.spool.depth)
                self.metrics.spool_age.set(self.spool.oldest_age())
                self.metrics.spool_bytes.set(self.spool.bytes)

    async def close(self) -> None:
        if self._pg_conn is not None:
            with contextlib.suppress(Exception):
                await self._pg_conn.close()
            self._pg_conn = None

    async def drain_once(self) -> int:
        """Seal the active file and move every sealed segment into the database."""
        await asyncio.to_thread(self.spool.seal)
        moved = 0
        for segment in self.spool.segments():
            moved += await self._move(segment)
        return moved

    async def _move(self, segment: Path) -> int:
        records = self.spool.kept(segment)  # what this process wrote; else parse the file off the loop
        if records is None:
            records = await asyncio.to_thread(read_segment, segment)
        for start in range(0, len(records), self.batch):
            batch = records[start : start + self.batch]
            try:
                await self._write(batch)
            except POISON:
                await self._isolate(batch)
        self.spool.remove(segment, len(records))  # one unlink: not worth a thread hop
        self.written += len(records)
        self.metrics.records_written.inc(len(records))
        return len(records)

    async def _isolate(self, batch: list[CallRecord]) -> None:
        """A batch the database refuses for its content: write records one by one, quarantine the bad ones.

        A poison record must not block the spool forever, and must not vanish: it goes
        to ``quarantine.jsonl`` beside the spool (fsync'd) and is counted.
        """
        for record in batch:
            try:
                await self._write([record])
            except POISON as exc:
                log.error("quarantined record %s: %s", record.id, exc)
                await asyncio.to_thread(_quarantine, self.spool.folder / "quarantine.jsonl", record, str(exc))
                self.metrics.records_dropped.labels("quarantined").inc()

    async def _write(self, records: list[CallRecord]) -> None:
        # One session row per session: the batch's last call of it.
        sessions = list({(r.project_id, r.session_id): r for r in records}.values())
        projects = {r.project_id for r in records}
        pg_url = self._pg_url
        # Encoding parses each long request (its cost grows with the conversation): in a thread, so the
        # serving loop gets its turns meanwhile instead of waiting out a batch of long calls.
        rows = await asyncio.to_thread(self.stored.encode, records) if self.stored is not None else records
        if not (pg_url and await self._write_pg(pg_url, rows, sessions, projects)):
            await self._write_portable(rows, sessions, projects)
        self._projects |= projects
        if self.stored is not None:
            self.stored.committed()

    async def _write_pg(
        self, url: str, completions: list[CallRecord], sessions: list[CallRecord], projects: set[str]
    ) -> bool:
        """Postgres: one transaction on the recorder's own connection. False: take the portable path."""
        conn = self._pg_conn
        if conn is None or conn.closed:
            conn = self._pg_conn = await psycopg.AsyncConnection.connect(url, connect_timeout=5)
        try:
            async with conn.transaction():
                if projects - self._projects:
                    await bulk.insert_projects(conn, projects - self._projects)
                touched = bulk.sessions_json(sessions)
                await bulk.upsert_sessions(conn, touched)  # locks the rows a delete locks first
                gone, pending = await bulk.checks(conn, touched, completions, projects)
                if gone:
                    completions = self._drop_deleted(completions, gone)
                if completions and self.stored is not None:  # the delta form (storage/stored_form.py)
                    present = await bulk.parents_present(conn, self.stored.outside_parents(completions))
                    completions = self.stored.settle(completions, present)
                    await add_prefixes_pg(conn, self.stored.prefixes(completions))  # the shared prefixes referenced
                if completions:
                    await bulk.copy_completions(conn, completions)  # COPY parses the ISO times itself
                if gone:  # rows of sessions that have no call left (not those started afresh after the delete)
                    await bulk.drop_empty(conn, self._emptied(gone, completions))
        except psycopg.OperationalError:
            await conn.close()
            self._pg_conn = None
            raise  # the database is unreachable: the run loop backs off and retries
        except psycopg.Error:
            return False  # already partly stored (a replayed segment) or refused: the portable path decides
        if pending and completions:  # rare: feedback came before its call; the orphan sweep covers a crash here
            # (and feedback stored after the check, before the commit: proxy/state.py sweeps every few seconds)
            async with self.sessionmaker() as db:
                await attach_pending(db, completions)
                await db.commit()
        return True

    async def _write_portable(
        self, completions: list[CallRecord], sessions: list[CallRecord], projects: set[str]
    ) -> None:
        """Any database, through SQLAlchemy: skips completions already stored; raises POISON on bad content."""
        async with self.sessionmaker() as db:
            conn = await db.connection()
            insert = insert_for(conn.dialect.name)
            missing = projects - self._projects
            if missing:
                await db.execute(
                    insert(Project)
                    .values([{"id": p, "settings": {}, "created_at": utcnow()} for p in missing])
                    .on_conflict_do_nothing()
                )
            # executemany with one statement per table: compiled once and cached, not per batch.
            if sessions:
                now = utcnow()
                stmt = insert(Session.__table__)
                stmt = stmt.on_conflict_do_update(
                    index_elements=["project_id", "id"], set_={"updated_at": stmt.excluded.updated_at}
                )
                await conn.execute(stmt, [{**s.session_row(), "created_at": now, "updated_at": now} for s in sessions])
            gone = await tombstoned_async(db, completions)
            if gone:
                completions = self._drop_deleted(completions, gone)
            if completions and self.stored is not None:  # the delta form (storage/stored_form.py)
                parents = self.stored.outside_parents(completions)
                present = set()
                if parents:
                    query = select(Completion.id).where(Completion.id.in_(parents)).with_for_update(key_share=True)
                    present = set((await db.scalars(query)).all())
                completions = self.stored.settle(completions, present)
                await add_prefixes(db, self.stored.prefixes(completions))  # the shared prefixes referenced
            if completions:
                rows = [c.row() for c in completions]
                await conn.execute(insert(Completion.__table__).on_conflict_do_nothing(), rows)
                # attach_pending reads five fields; no need to load the rows back as ORM objects.
                await attach_pending(db, completions)
            for project_id, session_id in self._emptied(gone, completions):
                stored = select(Completion.id).where(
                    Completion.project_id == project_id, Completion.session_id == session_id
                )
                await db.execute(
                    delete(Session).where(Session.project_id == project_id, Session.id == session_id, ~stored.exists())
                )
            await db.commit()

    def _drop_deleted(self, records: list[CallRecord], gone: Deleted) -> list[CallRecord]:
        """Records made before their session (or end user) was deleted never land (counted as dropped, reason
        "deleted"); later ones of the same id start the session afresh."""
        kept = [r for r in records if not gone.drops(r)]
        self.metrics.records_dropped.labels("deleted").inc(len(records) - len(kept))
        return kept

    @staticmethod
    def _emptied(gone: Deleted, kept: list[CallRecord]) -> set[tuple[str, str]]:
        """Deleted sessions of the batch none of whose calls it keeps: their upserted rows go again."""
        return set(gone.times) - {(r.project_id, r.session_id) for r in kept}


def _quarantine(path: Path, record: CallRecord, error: str) -> None:
    with path.open("ab") as handle:
        handle.write(orjson.dumps({"error": error, "record": orjson.Fragment(record.encode())}) + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
