"""Adapter versions into engine replicas: loaded, staged for a deployment, kept while needed, probed.

The engine replicas (:mod:`proxy.replicas` keeps their state) are probed with
``GET /v1/models``: in rotation every ``probe_every_s``, out of rotation every
second. A probe that gets an answer first loads every needed version the engine
lacks (it restarted, or missed a deployment while it was down), and only then puts
the replica back in rotation; a call never reaches a replica that does not list
the version it asks for while another one does. Versions no longer needed
(:func:`proxy.served.needed_versions`) are unloaded by the probe after a grace period, so an
engine with ``--max-loras`` does not fill up.

Deploying loads the version into the replicas in rotation (those out of rotation
get it when they return), verifies each lists it, then switches routing; its
answer says which replicas have it. Once one replica has it, the others have
:data:`STAGE_GRACE_S` more; one still loading then is ``pending`` and goes on
loading in the background, so a slow engine never holds a deployment.

Each replica has its own lock and every engine-side step its own time limit
(:data:`PROBE_TIMEOUT_S`, :attr:`EngineAdapters.load_timeout_s`): a probe or a load changes
one engine at a time, and one engine hung in ``load_lora_adapter`` holds up only its
own probe and its own share of a deployment (reported ``pending``, loaded when its
probe next succeeds), never the health checks of the others.

:class:`proxy.routing.Router` is the one subclass: it owns the alias table, which says
what is needed, and sets every attribute declared below.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.errors import NotFound, UpstreamError
from proxy.metrics import Metrics
from proxy.replicas import Replica, ReplicaSet
from proxy.served import LORA_NAME, VersionKey, committed_adapter, lora_name
from proxy.upstream import UPSTREAM_FAILURES, Upstream

log = logging.getLogger("onthejob.routing")

PROBE_TIMEOUT_S = 10.0  # GET /v1/models on one engine, and waiting for that engine's lock before it
LOAD_TIMEOUT_S = 120.0  # one engine's whole load of one adapter version (lock wait, load, verify)
STAGE_GRACE_S = 2.0  # once one replica loaded a version, the others' time to load it before the answer
UNLOAD_GRACE_S = 5.0  # a version unneeded this long is unloaded (sibling workers follow the alias table in 0.5 s)


class EngineAdapters(ABC):
    """The engine side of :class:`proxy.routing.Router`: loading, staging, reconciling, unloading, probing."""

    sessionmaker: async_sessionmaker[AsyncSession]
    upstream: Upstream
    metrics: Metrics
    default_project: str
    replicas: ReplicaSet
    base_models: set[str]
    load_timeout_s: float
    stage_grace_s: float
    on_reload: Callable[[Replica], Coroutine[Any, Any, None]] | None
    _aliases: dict[tuple[str, str], tuple[str, int | None]]
    _refreshed: bool
    _paths: dict[tuple[str, str, int], str]
    _unneeded: dict[str, float]
    _locks: dict[str, asyncio.Lock]
    _followups: set[asyncio.Task[Any]]

    @abstractmethod
    def _needed_keys(self) -> set[VersionKey]:
        """Every needed adapter version (the alias table's, pinned and fallbacks)."""

    @abstractmethod
    def needed(self) -> set[str]:
        """The engine-side names of every needed adapter version."""

    # ---- adapters in engines ----------------------------------------------------------
    async def _adapter_path(self, project: str, alias: str, version: int) -> str:
        key = (project, alias, version)
        if key not in self._paths:
            row = await committed_adapter(self.sessionmaker, project, alias, version)
            if row is None:
                raise NotFound(
                    f"no adapter {alias!r} version {version} in this project: list them at GET /v1/admin/adapters",
                    param="version",
                )
            self._paths[key] = row.path
        return self._paths[key]

    async def _list(self, replica: Replica) -> None:
        """Read what one engine lists now (raises when it does not answer)."""
        status, body = await self.upstream.get_json(replica.url, "/v1/models", timeout=2.0)
        if status != 200 or not isinstance(body, dict):
            raise UpstreamError(f"engine {replica.url} answered GET /v1/models with HTTP {status}")
        self.replicas.answered(replica, body.get("data") or [])
        self.base_models |= replica.bases

    async def ensure_loaded(self, replica: Replica, project: str, alias: str, version: int) -> None:
        """Load ``alias@vN`` into one engine unless it lists it already, then verify it is listed; the whole
        step (waiting for the engine's lock included) within ``load_timeout_s`` (TimeoutError after)."""
        async with asyncio.timeout(self.load_timeout_s), self._locks[replica.url]:
            await self._load(replica, project, alias, version)

    async def _load(self, replica: Replica, project: str, alias: str, version: int) -> None:
        """:meth:`ensure_loaded`, the engine's lock held."""
        name = lora_name(project, alias, version)
        await self._list(replica)
        if name in replica.models:
            return
        path = await self._adapter_path(project, alias, version)
        status, body = await self.upstream.post_json(
            replica.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout=self.load_timeout_s
        )
        if status != 200 and "already" not in str(body):
            self.metrics.adapter_loads.labels("failed").inc()
            raise UpstreamError(f"engine {replica.url} refused adapter {name} from {path}: {body}")
        await self._list(replica)
        if name not in replica.models:
            self.metrics.adapter_loads.labels("failed").inc()
            raise UpstreamError(f"engine {replica.url} does not list adapter {name} after loading it")
        self._unneeded.pop(name, None)
        self.metrics.adapter_loads.labels("ok").inc()

    async def stage(self, project: str, alias: str, version: int) -> dict[str, str]:
        """Load ``alias@vN`` into every replica in rotation without routing to it: replica → loaded | pending.

        Out of rotation (or unreachable while loading): ``pending``, loaded when it returns
        if the version is needed then (routed or pinned). An engine that answers but
        refuses the adapter fails the whole call: the adapter is at fault, not the engine.
        """
        report = {r.url: "pending" for r in self.replicas.replicas}

        async def one(replica: Replica) -> None:
            try:
                await self.ensure_loaded(replica, project, alias, version)
            except TimeoutError:  # hung in the load: it is loaded by its probe later, if still needed
                replica.last_error = f"loading {alias}@v{version}: no answer within {self.load_timeout_s:.0f} s"
                log.warning("engine %s: %s (pending)", replica.url, replica.last_error)
                return
            except UPSTREAM_FAILURES as exc:
                if self.replicas.unreachable(replica, f"{type(exc).__name__}: {exc}"):
                    log.warning(
                        "engine %s out of rotation: unreachable while loading %s@v%d", replica.url, alias, version
                    )
                return
            report[replica.url] = "loaded"

        loads = {asyncio.create_task(one(r)) for r in self.replicas.live}
        await self._first_loaded(loads, report)
        if "loaded" not in report.values():
            raise UpstreamError(
                f"no engine replica is up to load {alias!r} version {version} into; try again "
                "when GET /readyz shows one up"
            )
        return dict(report)

    async def _first_loaded(self, loads: set[asyncio.Task[None]], report: dict[str, str]) -> None:
        """Wait until every load is done, or one replica has loaded and the rest had ``stage_grace_s`` more.

        A slow or hung engine does not hold a deployment for its ``load_timeout_s``: it is reported
        ``pending`` and its load goes on in the background (bounded by that timeout); it serves the
        version once it lists it. An engine that refused the adapter before the answer fails the call."""
        pending = loads
        try:
            while pending and "loaded" not in report.values():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # an engine that refused the adapter: the adapter is at fault
            if pending:
                done, pending = await asyncio.wait(pending, timeout=self.stage_grace_s)
                for task in done:
                    task.result()
        finally:
            for task in pending:  # still loading: finished in the background, its outcome logged
                self._followups.add(task)
                task.add_done_callback(self._load_finished)

    def _load_finished(self, task: asyncio.Task[None]) -> None:
        self._followups.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a background adapter load failed: %s", task.exception())

    async def reconcile(self, replica: Replica) -> int:
        """Load every needed version this engine does not list (after a restart or an outage). Returns how many.

        Called with the engine's lock held (by :meth:`probe`); each load within ``load_timeout_s``."""
        loaded = 0
        for project, alias, version in sorted(self._needed_keys()):
            if lora_name(project, alias, version) not in replica.models:
                async with asyncio.timeout(self.load_timeout_s):
                    await self._load(replica, project, alias, version)
                loaded += 1
        return loaded

    async def unload_unneeded(self, replica: Replica) -> int:
        """Unload this proxy's adapter versions no longer needed (for at least the grace period). Returns how many."""
        if not self._refreshed:
            return 0
        needed, now, unloaded = self.needed(), time.monotonic(), 0
        listed = set().union(*(r.adapters for r in self.replicas.replicas))
        self._unneeded = {name: t for name, t in self._unneeded.items() if name in listed}
        for name in sorted(replica.adapters - needed):
            m = LORA_NAME.fullmatch(name)
            if m is None or (m["project"] or self.default_project, m["alias"]) not in self._aliases:
                continue  # not one of ours (an operator's --lora-modules): left alone
            if now - self._unneeded.setdefault(name, now) < UNLOAD_GRACE_S:
                continue
            status, body = await self.upstream.post_json(
                replica.url, "/v1/unload_lora_adapter", {"lora_name": name}, timeout=30
            )
            if status == 200 or status == 404:
                replica.models.discard(name)
                unloaded += 1
                self.metrics.adapter_unloads.labels("ok").inc()
                log.info("engine %s: unloaded %s (no alias routes to it)", replica.url, name)
            else:
                self.metrics.adapter_unloads.labels("failed").inc()
                log.warning("engine %s refused to unload %s: HTTP %d %s", replica.url, name, status, body)
        return unloaded

    # ---- health -----------------------------------------------------------------------
    async def probe(self, replica: Replica) -> None:
        """Ask one engine what it serves; load what it lacks before it (re)enters rotation; unload the unneeded.

        Under this engine's lock only, each step time-bound: another engine's hung load never delays it."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self._locks[replica.url].acquire()
        except TimeoutError:  # a load into this engine holds it (it times out by itself): probe next time
            log.warning("engine %s: still busy loading an adapter; probed next time", replica.url)
            return
        try:
            await self._probe(replica)
        finally:
            self._locks[replica.url].release()

    async def _probe(self, replica: Replica) -> None:
        """:meth:`probe`, the engine's lock held."""
        try:
            await self._list(replica)
        except Exception as exc:  # noqa: BLE001 - any failure means not answering
            if self.replicas.unreachable(replica, f"{type(exc).__name__}: {exc}"):
                log.warning("engine %s out of rotation: the probe got no answer (%s)", replica.url, exc)
            return
        try:
            loaded = await self.reconcile(replica)
        except Exception as exc:  # noqa: BLE001 - it still serves what it lists; routing avoids the rest
            replica.last_error = f"reconcile: {exc}"
            log.warning("engine %s answers but could not load every needed adapter: %s", replica.url, exc)
            loaded = 0
        if self.replicas.admit(replica):
            log.info("engine %s in rotation (%d adapter version(s) loaded first)", replica.url, loaded)
        elif loaded:
            log.info("engine %s had lost %d adapter version(s): reloaded", replica.url, loaded)
        if loaded and self.on_reload is not None:
            task: asyncio.Task[None] = asyncio.create_task(self.on_reload(replica))
            self._followups.add(task)
            task.add_done_callback(self._followups.discard)
        try:
            await self.unload_unneeded(replica)
        except Exception as exc:  # noqa: BLE001 - retried at the next probe
            log.warning("engine %s: unloading failed: %s", replica.url, exc)

    async def watch(self, every_s: float) -> None:
        """Probe replicas forever: in rotation every ``every_s`` seconds, out of rotation every second.

        Each probe runs as its own task: a slow one (an engine loading, or hung in a load) delays only
        its own replica's next probe, never the others'."""
        last = {r.url: time.monotonic() for r in self.replicas.replicas}  # discover() probed them at start
        running: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                now = time.monotonic()
                for replica in self.replicas.replicas:
                    if replica.url in running or now - last[replica.url] < (
                        every_s if replica.up else min(1.0, every_s)
                    ):
                        continue
                    last[replica.url] = now
                    task = asyncio.create_task(self.probe(replica))
                    running[replica.url] = task
                    task.add_done_callback(functools.partial(self._probed, running, replica.url))
                await asyncio.sleep(0.2)
        finally:
            for task in running.values():
                task.cancel()

    @staticmethod
    def _probed(running: dict[str, asyncio.Task[None]], url: str, task: asyncio.Task[None]) -> None:
        running.pop(url, None)
        if not task.cancelled() and task.exception() is not None:  # a bug, not an engine failure: keep probing
            log.error("probing %s failed: %r", url, task.exception())
