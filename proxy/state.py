"""What the app owns for its lifetime: settings, database, upstream client, spool, recorder, caches, housekeeper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from proxy.attest import Attestor
from proxy.auth import Auth
from proxy.link_feed import LinkFeed, Listener
from proxy.metrics import Metrics
from proxy.policies import Policies
from proxy.promotion import Promotion
from proxy.ratelimit import LeaseKeeper, RateLimiter, fallback_share
from proxy.recorder import Recorder
from proxy.recording import Recording
from proxy.routing import Router
from proxy.sessions import Linker
from proxy.settings import Settings
from proxy.spool import Spool
from proxy.spool_folders import absorb_orphans, claim
from proxy.upstream import Upstream
from storage.dataset_jobs import DatasetWorker
from storage.db import async_engine, database_url, libpq_url, sync_engine
from storage.feedback import count_orphans
from storage.housekeep import Housekeeper, Schedule, log_result
from storage.keys import ensure_key
from storage.models import Project

# What an unreachable database raises (SQLAlchemy wraps the driver's connection errors).
UNREACHABLE = (OperationalError, InterfaceError, OSError, TimeoutError)
log = logging.getLogger("onthejob.proxy")
# What a stop waits for, at most (AppState.stop; deploy/k8s's grace period covers their sum, a test reads them):
STOP_CANCEL_WAIT_S = 5.0  # for the background tasks after each cancel...
STOP_CANCEL_TRIES = 3  # ...of this many
STOP_HOUSEKEEPER_S = 10.0  # for a housekeeping job under way
STOP_DRAIN_S = 10.0  # for the last drain of the spool into the database


@dataclass
class AppState:
    settings: Settings
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    upstream: Upstream
    spool: Spool
    recorder: Recorder
    router: Router
    auth: Auth
    metrics: Metrics
    linker: Linker
    recording: Recording
    promotion: Promotion
    spool_lock: int = -1
    leases: LeaseKeeper | None = None  # this worker's rate-limit leases (proxy/ratelimit.py); None: no limit
    housekeeper: Housekeeper | None = None  # storage/housekeep.py, in a thread (settings.housekeep)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    draining: bool = False
    _sync_engine: Engine | None = None
    _datasets: DatasetWorker | None = None
    _housekeeping: tuple[threading.Thread, threading.Event] | None = None

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        engine = (
            async_engine(settings.database_url, pool_size=5, max_overflow=5)
            if not _sqlite(settings)
            else async_engine(settings.database_url)
        )
        maker = async_sessionmaker(engine, expire_on_commit=False)
        metrics = Metrics()
        upstream = Upstream(settings.upstreams, settings.connect_timeout_s, settings.idle_timeout_s)
        folder, lock_fd = claim(settings.spool_dir)  # one folder per worker process
        spool = Spool(folder, settings.spool_max_bytes)
        recorder = Recorder(spool, maker, metrics, settings.drain_batch)
        linker = Linker(spool, maker)
        policies = Policies(settings.spool_dir)  # the last known redaction policies, until the database answers
        policies.load()
        router = Router(maker, upstream, metrics, settings.default_project)
        attestor = Attestor(maker, router, metrics)
        limiter = RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst)
        leases = None
        if not _sqlite(settings):
            # Every worker on Postgres renews its presence (and, with limits on, its keys' leases): the live
            # hosts are counted from it, and only while another host is live does a turn whose parent is
            # nowhere here wait for that host's recorder (proxy/sessions.py).
            keeper = leases = LeaseKeeper(limiter, maker, settings.host_id, str(os.getpid()), workers=settings.workers)
            linker.other_hosts = lambda: keeper.hosts > 1
            if settings.link_feed:  # link keys for the other hosts as soon as a call is answered (proxy/link_feed.py)
                linker.feed = LinkFeed(maker, settings.host_id)
                linker.listener = Listener(libpq_url(database_url(settings.database_url)), settings.host_id)
        else:  # SQLite is one host: its workers split the limit evenly, no leases (no writer beside the recorder)
            limiter.fallback = fallback_share(settings.rate_limit_rps, 1, settings.workers)
        return cls(
            settings=settings,
            engine=engine,
            sessionmaker=maker,
            upstream=upstream,
            spool=spool,
            recorder=recorder,
            router=router,
            auth=Auth(
                maker,
                enabled=settings.auth,
                default_project=settings.default_project,
                ttl_s=settings.key_cache_ttl_s,
                ratelimiter=limiter,
            ),
            metrics=metrics,
            linker=linker,
            recording=Recording(
                spool,
                linker,
                metrics,
                enabled=settings.record,
                full_policy=settings.spool_full_policy,
                wake_at=settings.drain_batch,
                wake=recorder.wake,
                policies=policies,
            ),
            promotion=Promotion(maker, router, attestor, metrics),
            spool_lock=lock_fd,
            leases=leases,
        )

    @property
    def attestor(self) -> Attestor:
        return self.promotion.attestor

    @property
    def sync_engine(self) -> Engine:
        """A sync engine for database work done in threads, off the event loop (housekeeping, datasets);
        built at first use."""
        if self._sync_engine is None:
            pool = {} if _sqlite(self.settings) else {"pool_size": 3, "max_overflow": 3}
            self._sync_engine = sync_engine(self.settings.database_url, **pool)
        return self._sync_engine

    @property
    def datasets(self) -> DatasetWorker:
        """The dataset routes' process (storage/dataset_jobs.py), started at their first call."""
        if self._datasets is None:
            self._datasets = DatasetWorker(database_url(self.settings.database_url), lambda: self.sync_engine)
        return self._datasets

    async def start(self) -> None:
        await asyncio.to_thread(absorb_orphans, self.spool)  # records a worker that is gone left behind
        await self.router.discover()
        await self._start_with_database()
        self.tasks.append(asyncio.create_task(self.recorder.run(), name="recorder"))
        self.tasks.append(asyncio.create_task(self._follow(), name="follow"))
        self.tasks.append(asyncio.create_task(self.linker.deletes.follow(), name="deletions"))  # proxy/link_deletes.py
        self.tasks.append(asyncio.create_task(self.router.watch(self.settings.probe_every_s), name="probes"))
        if self.leases is not None:
            self.tasks.append(asyncio.create_task(self.leases.run(), name="rate-leases"))
        if self.linker.feed is not None:
            self.tasks.append(asyncio.create_task(self.linker.feed.run(), name="link-feed"))
        if self.linker.listener is not None:
            self.tasks.append(asyncio.create_task(self.linker.listener.run(), name="link-listener"))
        if self.settings.housekeep:
            self.start_housekeeper()

    def start_housekeeper(self) -> None:
        """The housekeeping jobs (storage/housekeep.py) on the proxy's schedule, in a thread: the sweep every
        ``reconcile_every_s``, retention and pruning every ``retention_every_s``. Copies in sibling workers
        and other hosts take turns by advisory lock."""
        every = self.settings.retention_every_s
        schedule = Schedule(sweep_every_s=self.settings.reconcile_every_s, retention_every_s=every, prune_every_s=every)
        self.housekeeper = Housekeeper(self.sync_engine, schedule, report=self._housekept)
        stop = threading.Event()
        thread = threading.Thread(target=self.housekeeper.run_forever, args=(stop,), name="housekeeper", daemon=True)
        thread.start()
        self._housekeeping = (thread, stop)

    def _housekept(self, job: str, result: dict[str, Any]) -> None:
        log_result(job, result)
        if job == "sweep":
            self.metrics.feedback_orphans.set(result["orphans"])

    async def _start_with_database(self) -> None:
        """The start-up steps that need the database, each on its own: one that fails for its own reason
        (a bad row, a bug) does not skip the others, the policies' first refresh above all (without it this
        worker refuses every recorded call). An unreachable database stops the rest: they would wait out
        the same connect timeout, and the housekeeping loop retries the refresh."""
        for step in (self.ensure_admin_key, self.router.register_base_aliases, self.refresh):
            try:
                await step()
            except UNREACHABLE as exc:
                log.warning("database not reachable at start (%s); aliases and policies load when it returns", exc)
                return
            except Exception:  # noqa: BLE001 - logged with its traceback; the next step still runs
                log.exception("start-up step %s failed; the next ones run", step.__name__)
        if self.router.needed():  # the engines were probed before the alias table was read
            await self.router.discover()

    async def ensure_admin_key(self) -> None:
        """``ONTHEJOB_ADMIN_KEY``, when set, is an admin key of the default project (idempotent)."""
        if not (self.settings.admin_key and self.settings.auth):
            return
        secret, project = self.settings.admin_key, self.settings.default_project
        async with self.sessionmaker() as db:
            try:
                if await db.run_sync(lambda s: ensure_key(s, project, secret, "admin", "ONTHEJOB_ADMIN_KEY")):
                    await db.commit()
                    log.info("ONTHEJOB_ADMIN_KEY registered as an admin key of project %r", project)
            except IntegrityError:
                await db.rollback()  # a sibling worker registered it at the same moment
            except ValueError as exc:
                await db.rollback()
                log.error("ONTHEJOB_ADMIN_KEY not registered: %s", exc)

    async def _follow(self) -> None:
        """Follow deployments (alias table) quickly; adopt orphaned spools; decide candidates; re-attest.

        The database's maintenance (feedback sweep, retention, pruning) is the housekeeper's, in a thread
        (:meth:`start_housekeeper`) or in ``onthejob housekeep``; without it here, this loop still counts
        orphaned feedback for ``/metrics``.
        """
        ticks_per_reconcile = max(1, int(self.settings.reconcile_every_s / self.settings.alias_refresh_s))
        ticks_per_attest = max(1, int(self.settings.attest_every_s / self.settings.alias_refresh_s))
        ticks_per_decision = max(1, int(self.settings.promotion_every_s / self.settings.alias_refresh_s))
        tick = 0
        while True:
            await asyncio.sleep(self.settings.alias_refresh_s)
            with contextlib.suppress(Exception):
                await self.refresh()
            tick += 1
            if tick % ticks_per_reconcile == 0:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(absorb_orphans, self.spool)
                if self.housekeeper is None:
                    with contextlib.suppress(Exception):
                        await self.count_orphans()
            if tick % ticks_per_decision == 0:
                with contextlib.suppress(Exception):
                    await self.promotion.tick()
            if tick % ticks_per_attest == 0:
                with contextlib.suppress(Exception):
                    await self.attestor.check_all()

    async def refresh(self) -> None:
        """Reload what other replicas or the trainer may have changed: aliases and project policies."""
        await self.router.refresh()
        await self.promotion.refresh()
        async with self.sessionmaker() as db:
            rows = (await db.execute(select(Project.id, Project.settings))).all()
        self.recording.policies.update(dict(rows))  # and kept beside the spool for a start without the database

    async def count_orphans(self) -> None:
        """Export how many pending feedback items are older than their TTL (the housekeeper does it when here)."""
        async with self.sessionmaker() as db:
            self.metrics.feedback_orphans.set(await count_orphans(db))

    async def stop(self, grace_s: float = 30.0) -> None:
        """Finish in-flight calls (up to a grace period), flush the spool into the database, close."""
        self.draining = True
        if self.inflight:
            await asyncio.wait(self.inflight, timeout=grace_s)
        await self._cancel_tasks()
        if self._datasets is not None:
            self._datasets.close()
        await self._stop_housekeeper()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(STOP_DRAIN_S):
                await self.recorder.drain_once()
        await self.recorder.close()
        self.spool.close()
        os.close(self.spool_lock)  # releases our spool folder (after the final drain)
        await self.upstream.close()
        await self.engine.dispose()

    async def _cancel_tasks(self) -> None:
        """Cancel the background tasks and wait for them, bounded: a task that lost its cancellation (Python
        3.11's ``wait_for`` can) is cancelled again, and one still running after that is left, logged, so
        that the stop always ends."""
        pending = set(self.tasks)
        for attempt in range(STOP_CANCEL_TRIES):
            for task in pending:
                task.cancel()
            done, pending = await asyncio.wait(pending, timeout=STOP_CANCEL_WAIT_S)
            for task in done:  # retrieved, so an ending exception is not reported as never retrieved
                if not task.cancelled():
                    task.exception()
            if not pending:
                return
            names = [t.get_name() for t in pending]
            log.warning("background tasks still running after cancel %d: %s", attempt + 1, names)

    async def _stop_housekeeper(self) -> None:
        """Stop the housekeeping thread (a job under way finishes first, up to 10 s), then the sync engine."""
        if self._housekeeping is not None:
            thread, stop = self._housekeeping
            stop.set()
            await asyncio.to_thread(thread.join, STOP_HOUSEKEEPER_S)
            if thread.is_alive():
                log.warning("housekeeping still running after 10 s; leaving it to end with the process")
                return
        if self._sync_engine is not None:
            await asyncio.to_thread(self._sync_engine.dispose)


def _sqlite(settings: Settings) -> bool:
    from storage.db import database_url, is_sqlite

    return is_sqlite(database_url(settings.database_url))
