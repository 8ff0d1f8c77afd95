"""Housekeeping: the database's periodic maintenance, on one schedule, off the serving loop.

The jobs (:class:`Schedule` says how often each runs; 0 turns one off), in the order they run
when due together:

    sweep      pending feedback whose call has landed attaches (storage/feedback.py), a bounded
               part of the last TTL each time, walked on by cursor; reports how many are orphans
    retention  each project's ``retention_days`` (storage/retention.py)
    prune      the change log's entries every reader has passed (storage/changes.py)

``onthejob housekeep`` runs them in a process of its own; ``onthejob serve`` starts one such process
beside its workers unless told not to (``--no-housekeep``): a process, not a thread of each worker,
since a thread shares the worker's GIL and its Python work (building statements, reading rows) showed
as serving-loop lag (issue 33). It stops when its stdin, a pipe serve holds, closes, so it ends with
serve, killed or not. The workers count orphaned feedback for ``/metrics`` themselves; the process
logs what each job did. An app created with ``housekeep`` on (tests, embedding) still runs the
schedule in a thread (proxy/state.py).

Safe to run as several copies (workers, hosts, a ``housekeep`` beside them): on Postgres each job runs
on its own connection holding a session-level advisory lock (``pg_try_advisory_lock``); a copy that
finds it taken skips that turn, since another copy is doing the job. On SQLite the database
serialises writers, and one copy is expected.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session as DbSession

from storage.changes import KEEP_LAST, prune_all
from storage.feedback import ORPHAN_TTL, Cursor, orphans_stmt, sweep_pending
from storage.retention import apply_retention

log = logging.getLogger("onthejob.housekeep")
Result = dict[str, Any]
Report = Callable[[str, Result], None]


@dataclass(frozen=True)
class Schedule:
    """Seconds between runs of each job (0: never), and what the jobs take."""

    sweep_every_s: float = 5.0
    retention_every_s: float = 3600.0
    prune_every_s: float = 3600.0
    orphan_ttl_s: float = ORPHAN_TTL.total_seconds()
    sweep_pages: int = 20  # pages of 500 pending items a sweep looks at; the next sweep walks on from there
    keep_changes: int = KEEP_LAST


@dataclass
class Job:
    name: str
    every_s: float
    run: Callable[[DbSession], Result]
    due: float = 0.0  # monotonic time of its next run


def lock_key(name: str) -> int:
    """The job's advisory lock: a signed 64-bit number from its name (the same in every copy)."""
    return int.from_bytes(hashlib.sha256(f"onthejob.housekeep.{name}".encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def exclusive(engine: Engine, name: str) -> Iterator[Connection | None]:
    """A connection holding ``name``'s advisory lock (Postgres), or None when another copy holds it."""
    with engine.connect() as conn:
        if conn.dialect.name != "postgresql":
            yield conn
            return
        key = lock_key(name)
        got = bool(conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}))
        conn.commit()
        if not got:
            yield None
            return
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):  # a broken connection: the server released the lock with it
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()


class Housekeeper:
    """Runs each job when it is due, under its lock; ``report`` gets what each run did."""

    def __init__(self, engine: Engine, schedule: Schedule | None = None, report: Report | None = None) -> None:
        self.engine = engine
        self.schedule = schedule = schedule or Schedule()
        self.report = report or log_result
        self.runs: Counter[tuple[str, str]] = Counter()  # (job, "done" | "skipped" | "failed")
        self._after: Cursor | None = None  # where the next sweep starts
        self.jobs = [
            Job("sweep", schedule.sweep_every_s, self._sweep),
            Job("retention", schedule.retention_every_s, lambda db: {"projects": apply_retention(db)}),
            Job(
                "prune", schedule.prune_every_s, lambda db: {"projects": prune_all(db, keep_last=schedule.keep_changes)}
            ),
        ]
        now = time.monotonic()
        for job in self.jobs:  # the sweep after one period; retention and pruning soon after start
            job.due = now + (job.every_s if job.name == "sweep" else 0.0)

    def _sweep(self, db: DbSession) -> Result:
        ttl = timedelta(seconds=self.schedule.orphan_ttl_s)
        swept = sweep_pending(db, after=self._after, ttl=ttl, pages=self.schedule.sweep_pages)
        db.commit()
        self._after = swept.after
        orphans = int(db.scalar(orphans_stmt(ttl)) or 0)
        return {"attached": swept.attached, "looked": swept.looked, "orphans": orphans}

    def run(self, job: Job) -> Result | None:
        """One run of ``job`` now; None when another copy holds its lock or it failed (logged, counted)."""
        try:
            with exclusive(self.engine, job.name) as conn:
                if conn is None:
                    self.runs[job.name, "skipped"] += 1
                    return None
                with DbSession(bind=conn) as db:
                    result = job.run(db)
                    db.commit()
        except Exception as exc:  # noqa: BLE001 - the database may be down; the next period catches up
            self.runs[job.name, "failed"] += 1
            log.warning(
                "housekeeping: %s failed (%s: %s); next at its next period",
                job.name,
                exc.__class__.__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            return None
        self.runs[job.name, "done"] += 1
        self.report(job.name, result)
        return result

    def run_due(self, now: float | None = None) -> dict[str, Result | None]:
        """Every job whose time has come, in order; what each did."""
        now = time.monotonic() if now is None else now
        out: dict[str, Result | None] = {}
        for job in self.jobs:
            if job.every_s > 0 and job.due <= now:
                job.due = now + job.every_s
                out[job.name] = self.run(job)
        return out

    def run_all(self) -> dict[str, Result | None]:
        """Every job once, now, whatever its period (``onthejob housekeep --once``)."""
        return {job.name: self.run(job) for job in self.jobs}

    def wait_s(self) -> float:
        """Seconds until the next job is due (an hour when none runs)."""
        dues = [job.due for job in self.jobs if job.every_s > 0]
        return max(0.0, min(dues) - time.monotonic()) if dues else 3600.0

    def run_forever(self, stop: threading.Event) -> None:
        """Run jobs as they fall due until ``stop`` is set."""
        while not stop.is_set():
            self.run_due()
            stop.wait(max(0.05, self.wait_s()))


def log_result(job: str, result: Result) -> None:
    """The default report: a line for what changed anything."""
    if job == "sweep":
        if result["attached"]:
            log.info(
                "sweep: attached %d pending feedback items (%d orphans older than the TTL)",
                result["attached"],
                result["orphans"],
            )
        return
    for project, counts in sorted(result["projects"].items()):
        if job == "retention" and any(counts.values()):
            log.info("retention: project %r: deleted %s", project, counts)
        elif job == "prune" and counts:
            log.info("change log: project %r: pruned %d entries every reader has passed", project, counts)
