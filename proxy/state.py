"""What the app owns for its lifetime: settings, database, upstream client, spool, recorder, caches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from proxy.attest import Attestor
from proxy.auth import Auth
from proxy.metrics import Metrics
from proxy.policies import Policies
from proxy.promotion import Promotion
from proxy.ratelimit import RateLimiter
from proxy.recorder import Recorder
from proxy.recording import Recording
from proxy.routing import Router
from proxy.sessions import Linker
from proxy.settings import Settings
from proxy.spool import Spool
from proxy.spool_folders import absorb_orphans, claim
from proxy.upstream import Upstream
from storage.changes import prune_all
from storage.db import async_engine
from storage.feedback import attach_orphans, count_orphans
from storage.keys import ensure_key
from storage.models import Project
from storage.retention import apply_retention

# What an unreachable database raises (SQLAlchemy wraps the driver's connection errors).
UNREACHABLE = (OperationalError, InterfaceError, OSError, TimeoutError)
log = logging.getLogger("onthejob.proxy")


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
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    draining: bool = False

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
                ratelimiter=RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst),
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
        )

    @property
    def attestor(self) -> Attestor:
        return self.promotion.attestor

    async def start(self) -> None:
        await asyncio.to_thread(absorb_orphans, self.spool)  # records a worker that is gone left behind
        await self.router.discover()
        await self._start_with_database()
        self.tasks.append(asyncio.create_task(self.recorder.run(), name="recorder"))
        self.tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        self.tasks.append(asyncio.create_task(self.router.watch(self.settings.probe_every_s), name="probes"))

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

    async def _housekeeping(self) -> None:
        """Follow deployments (alias table) quickly; sweep pending feedback and orphaned spools; retention, pruning."""
        ticks_per_reconcile = max(1, int(self.settings.reconcile_every_s / self.settings.alias_refresh_s))
        ticks_per_attest = max(1, int(self.settings.attest_every_s / self.settings.alias_refresh_s))
        ticks_per_decision = max(1, int(self.settings.promotion_every_s / self.settings.alias_refresh_s))
        every = self.settings.retention_every_s
        ticks_per_retention = max(1, int(every / self.settings.alias_refresh_s)) if every > 0 else 0
        tick = 0
        while True:
            await asyncio.sleep(self.settings.alias_refresh_s)
            with contextlib.suppress(Exception):
                await self.refresh()
            tick += 1
            if tick % ticks_per_reconcile == 0:
                with contextlib.suppress(Exception):
                    await self.sweep_feedback()
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(absorb_orphans, self.spool)
            if tick % ticks_per_decision == 0:
                with contextlib.suppress(Exception):
                    await self.promotion.tick()
            if tick % ticks_per_attest == 0:
                with contextlib.suppress(Exception):
                    await self.attestor.check_all()
            if ticks_per_retention and (tick - 1) % ticks_per_retention == 0:  # soon after start, then each period
                await self.expire()

    async def expire(self) -> None:
        """Apply each project's retention (storage/retention.py) and prune the change log of what every reader
        has passed (storage/changes.py); a failure waits for the next period."""
        try:
            async with self.sessionmaker() as db:
                done, pruned = await db.run_sync(lambda s: (apply_retention(s), prune_all(s)))
        except Exception as exc:  # noqa: BLE001 - the database may be down; the next pass catches up
            log.warning("retention pass failed (%s); retrying next period", exc.__class__.__name__)
            return
        for project, counts in done.items():
            if any(counts.values()):
                log.info("retention: project %r: deleted %s", project, counts)
        for project, entries in pruned.items():
            if entries:
                log.info("change log: project %r: pruned %d entries every reader has passed", project, entries)

    async def refresh(self) -> None:
        """Reload what other replicas or the trainer may have changed: aliases and project policies."""
        await self.router.refresh()
        await self.promotion.refresh()
        async with self.sessionmaker() as db:
            rows = (await db.execute(select(Project.id, Project.settings))).all()
        self.recording.policies.update(dict(rows))  # and kept beside the spool for a start without the database

    async def sweep_feedback(self) -> None:
        """Attach pending feedback whose call has landed since; export how many stay orphaned."""
        async with self.sessionmaker() as db:
            if await attach_orphans(db):
                await db.commit()
            self.metrics.feedback_orphans.set(await count_orphans(db))

    async def stop(self, grace_s: float = 30.0) -> None:
        """Finish in-flight calls (up to a grace period), flush the spool into the database, close."""
        self.draining = True
        if self.inflight:
            await asyncio.wait(self.inflight, timeout=grace_s)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.recorder.drain_once(), timeout=10)
        await self.recorder.close()
        self.spool.close()
        os.close(self.spool_lock)  # releases our spool folder (after the final drain)
        await self.upstream.close()
        await self.engine.dispose()


def _sqlite(settings: Settings) -> bool:
    from storage.db import database_url, is_sqlite

    return is_sqlite(database_url(settings.database_url))
