"""Aliases → served models; a deployment switches an alias to a version once engines hold it.

An alias routes to ``alias@vN`` (the deployed adapter, a new engine-side name per
version, since vLLM caches by name) or to its base model. Every proxy worker
refreshes the alias table from the database twice a second, so a deployment made
through any of them is followed by all within 1 s.

Loading versions into the engine replicas, keeping them there while needed (what
:meth:`Router.needed` says), unloading them after, and probing the engines is
:class:`proxy.engine_adapters.EngineAdapters`, which :class:`Router` extends.
Deploying stages the version there, then switches routing.

When a check (proxy/attest.py) finds the deployed version bad on every replica that
has it, :attr:`Router.fallbacks` routes the alias to its previous attested version
while one is loaded, as a canary's rollback would; the version stays loaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.engine_adapters import LOAD_TIMEOUT_S, STAGE_GRACE_S, EngineAdapters
from proxy.errors import InvalidRequest, NotFound
from proxy.metrics import Metrics
from proxy.replicas import Replica, ReplicaSet
from proxy.served import Route, VersionKey, lora_name, needed_versions
from proxy.upstream import Upstream
from storage.db import insert_for
from storage.models import Adapter, Alias, Deployment, Project, utcnow


class Router(EngineAdapters):
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        upstream: Upstream,
        metrics: Metrics,
        default_project: str,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.upstream = upstream
        self.metrics = metrics
        self.default_project = default_project
        self.replicas = ReplicaSet(upstream.urls)
        self.base_models: set[str] = set()
        self.pinned: set[VersionKey] = set()  # loaded but not (only) routed: see needed_versions
        self._aliases: dict[tuple[str, str], tuple[str, int | None]] = {}
        self._refreshed = False  # nothing is unloaded before the alias table was read once
        self._paths: dict[tuple[str, str, int], str] = {}
        self._unneeded: dict[str, float] = {}  # engine-side name → when a probe first found it unneeded
        self.load_timeout_s = LOAD_TIMEOUT_S
        self.stage_grace_s = STAGE_GRACE_S
        # One probe, load or unload changes an engine at a time; each engine has its own lock.
        self._locks = {url: asyncio.Lock() for url in upstream.urls}
        self._deploying = asyncio.Lock()  # deployments switch routing one at a time (each step time-bound)
        # (project, alias) → (the deployed version that failed its check on every replica, the one served instead)
        self.fallbacks: dict[tuple[str, str], tuple[int, int]] = {}
        # Called (as a task) after a probe loaded adapter versions into a replica: attestation checks them.
        self.on_reload: Callable[[Replica], Coroutine[Any, Any, None]] | None = None
        self._followups: set[asyncio.Task[Any]] = set()

    # ---- the alias table -------------------------------------------------------------
    async def discover(self) -> None:
        """Probe every replica once (at start): learns the base models and what each engine holds."""
        await asyncio.gather(*(self.probe(r) for r in self.replicas.replicas))

    async def register_base_aliases(self) -> None:
        """Each engine's base model becomes an alias of the default project, so /v1/models answers at once.

        Workers starting together (``serve --workers N``) all do this at once: every row is inserted
        unless a sibling's is already there. (Reading first and adding what was missing lost that race,
        and the worker that lost it skipped the rest of its start: no policies until its next refresh.)
        """
        project = self.default_project
        async with self.sessionmaker() as db:
            insert = insert_for(db.get_bind().dialect.name)
            await db.execute(
                insert(Project).values(id=project, settings={}, created_at=utcnow()).on_conflict_do_nothing()
            )
            if self.base_models:
                rows = [
                    {
                        "project_id": project,
                        "name": name,
                        "base_model": name,
                        "created_at": utcnow(),
                        "updated_at": utcnow(),
                    }
                    for name in sorted(self.base_models)
                ]
                await db.execute(insert(Alias).values(rows).on_conflict_do_nothing())
            await db.commit()

    async def refresh(self) -> None:
        async with self.sessionmaker() as db:
            rows = (
                await db.execute(select(Alias.project_id, Alias.name, Alias.base_model, Alias.deployed_version))
            ).all()
        table = {(p, n): (b, v) for p, n, b, v in rows}
        changed = {lora_name(p, n, v) for (p, n), (_, v) in table.items() if v is not None}
        changed -= {lora_name(p, n, v) for (p, n), (_, v) in self._aliases.items() if v is not None}
        if any(not self.replicas.loaded_on(name) for name in changed):
            # Another worker deployed it: learn which engines hold it before routing to it.
            await asyncio.gather(*(self._list(r) for r in self.replicas.live), return_exceptions=True)
        self._aliases = table
        self._refreshed = True

    def resolve(self, project: str, name: Any) -> Route:
        """The route for a model name as the client sent it."""
        if not isinstance(name, str) or not name:
            raise InvalidRequest("'model' is required: pass an alias from GET /v1/models", param="model")
        hit = self._aliases.get((project, name))
        if hit is not None:
            base, version = hit
            fallback = self.fallbacks.get((project, name))
            if version is not None and fallback is not None and fallback[0] == version:
                version = fallback[1]  # the deployed version failed attestation everywhere: its predecessor
            served = lora_name(project, name, version) if version is not None else base
            return Route(name, served, version, base)
        if name in self.base_models:  # every project may call the engines' base models directly
            return Route(name, name, None, name)
        raise NotFound(
            f"the model {name!r} does not exist: use one of the aliases from GET /v1/models",
            param="model",
            code="model_not_found",
        )

    def visible(self, project: str) -> list[str]:
        names = {n for (p, n) in self._aliases if p == project} | self.base_models
        return sorted(names)

    def deployed(self, project: str, alias: str) -> int | None:
        """The version the alias table routes ``alias`` to (None: its base model, or no such alias)."""
        hit = self._aliases.get((project, alias))
        return hit[1] if hit is not None else None

    def _needed_keys(self) -> set[VersionKey]:
        held = {(p, a, v) for (p, a), (_, v) in self.fallbacks.items()}
        return needed_versions(self._aliases, self.pinned | held)

    def needed(self) -> set[str]:
        """The engine-side names of every needed adapter version."""
        return {lora_name(*key) for key in self._needed_keys()}

    async def deploy(self, project: str, alias: str, version: int | None) -> dict[str, Any]:
        """Load into the replicas in rotation, verify, then switch routing (and record the deployment)."""
        async with self._deploying:
            row = await self._alias_row(project, alias, version)
            previous = row.deployed_version
            try:
                if version is None:  # the base model: every engine serves it
                    report = {r.url: "loaded" if r.up else "pending" for r in self.replicas.replicas}
                else:
                    report = await self.stage(project, alias, version)
            except Exception as exc:
                await self._record(project, alias, version, previous, "failed", {"error": str(exc)})
                raise
            async with self.sessionmaker() as db:
                live = await db.scalar(select(Alias).where(Alias.project_id == project, Alias.name == alias))
                if live is None:
                    live = Alias(project_id=project, name=alias, base_model=row.base_model)
                    db.add(live)
                live.deployed_version = version
                await db.commit()
            dep_id = await self._record(project, alias, version, previous, "active", {"replicas": report})
            self._aliases[(project, alias)] = (row.base_model, version)
            served = lora_name(project, alias, version) if version is not None else row.base_model
            return {
                "id": dep_id,
                "alias": alias,
                "version": version,
                "previous_version": previous,
                "served_model": served,
                "status": "active",
                "replicas": report,
            }

    async def _alias_row(self, project: str, alias: str, version: int | None) -> Alias:
        """The alias being deployed (a new one for an adapter's alias not created yet), checked."""
        async with self.sessionmaker() as db:
            row = await db.scalar(select(Alias).where(Alias.project_id == project, Alias.name == alias))
            adapter = None
            if version is not None:
                adapter = await db.scalar(
                    select(Adapter).where(
                        Adapter.project_id == project,
                        Adapter.alias == alias,
                        Adapter.version == version,
                        Adapter.committed(),
                    )
                )
                if adapter is None:
                    raise NotFound(
                        f"no adapter {alias!r} version {version}: the trainer publishes them; list "
                        "them at GET /v1/admin/adapters",
                        param="version",
                    )
            if row is None:
                if adapter is None:
                    raise NotFound(f"no alias {alias!r} in this project", param="alias")
                row = Alias(project_id=project, name=alias, base_model=adapter.base_model)
            return row

    async def _record(
        self, project: str, alias: str, version: int | None, previous: int | None, status: str, detail: dict[str, Any]
    ) -> int:
        async with self.sessionmaker() as db:
            dep = Deployment(
                project_id=project,
                alias=alias,
                version=version,
                previous_version=previous,
                status=status,
                detail=detail,
            )
            db.add(dep)
            await db.commit()
            return int(dep.id)
