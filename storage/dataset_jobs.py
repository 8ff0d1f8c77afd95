"""The dataset routes' work (storage/datasets.py) in a process of its own, beside the serving worker.

Making a dataset assembles every candidate session (10,000 of them take seconds of CPU), and a show or
a diff builds every item. In a thread of the serving process that work still holds the GIL the event
loop needs, and showed as serving lag (issue 33: ``python -m bench.serving_under_load``); in a child
process it shares nothing with the loop but the machine's cores.

One child per serving worker, started at the first dataset call (``spawn``: a fresh interpreter, never
a fork of a process with an event loop and open sockets), doing one job at a time on its own database
connection; a job's storage error comes back as itself (:class:`storage.datasets.DatasetError`), so the
routes map it as before. A child that dies (killed, out of memory) fails the call under way with
:class:`WorkerGone`, and the next call starts another. A database only this process can see (SQLite in
memory) is worked on in a thread instead, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session as DbSession

from storage import datasets
from storage.db import database_url, is_sqlite, sync_engine

# What each job runs: (function of a session and its arguments, whether it commits).
JOBS: dict[str, tuple[Callable[..., Any], bool]] = {
    "create": (datasets.create, True),
    "list": (datasets.list_datasets, False),
    "show": (datasets.show, False),
    "diff": (datasets.diff, False),
}

APPLICATION_NAME = "onthejob-datasets"  # the child's connections, as Postgres's pg_stat_activity shows them
PARENT_POLL_S = 1.0  # how often the child checks that its parent is alive
_engines: dict[str, Engine] = {}  # in the child: one engine per database, kept for its life


class WorkerGone(RuntimeError):
    """The dataset process ended while a job ran (killed, out of memory): nothing was committed."""


def work(engine: Engine, job: str, args: tuple[Any, ...]) -> Any:
    """Run ``job`` on a session of its own; commit when the job writes."""
    run, commits = JOBS[job]
    with DbSession(engine) as db:
        out = run(db, *args)
        if commits:
            db.commit()
        return out


def _in_child(url: str, job: str, args: tuple[Any, ...]) -> Any:
    """The child's side: the engine for ``url`` (built once), then the job."""
    engine = _engines.get(url)
    if engine is None:
        named = {"pool_size": 1, "max_overflow": 0, "connect_args": {"application_name": APPLICATION_NAME}}
        engine = _engines[url] = sync_engine(url, **({} if is_sqlite(url) else named))
    return work(engine, job, args)


def _watch_parent(parent: int) -> None:
    """In the child: end when the serving worker that started it is gone (killed: nothing told us)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def shared(url: str) -> bool:
    """Whether another process can open this database (not SQLite in memory)."""
    url = database_url(url)
    return not (is_sqlite(url) and (url.rstrip("/").endswith(":memory:") or url.rstrip("/") in ("sqlite:", "sqlite:/")))


class DatasetWorker:
    """The serving worker's handle on its dataset process; ``threaded`` engine: work in a thread instead."""

    def __init__(self, url: str, threaded: Callable[[], Engine]) -> None:
        self.url = url
        self.threaded = None if shared(url) else threaded
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, job: str, *args: Any) -> Any:
        """``job`` (a key of :data:`JOBS`) with these arguments, off this process's event loop and GIL."""
        if self.threaded is not None:
            return await asyncio.to_thread(work, self.threaded(), job, args)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_watch_parent,
                initargs=(os.getpid(),),
            )
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, _in_child, self.url, job, args)
        except BrokenProcessPool as exc:
            if self._pool is pool:
                self._pool = None  # the next call starts another
            pool.shutdown(wait=False)
            raise WorkerGone("the dataset process ended while it worked; nothing was changed, try again") from exc

    def close(self) -> None:
        """Stop the process now: a job under way is one transaction, rolled back when its connection ends."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        children = list((getattr(pool, "_processes", None) or {}).values())  # shutdown alone waits for the job
        pool.shutdown(wait=False, cancel_futures=True)
        for child in children:
            with contextlib.suppress(Exception):
                child.terminate()
