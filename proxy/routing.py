"""Aliases → served models, deployments into every engine replica, reconciliation after restarts.

An alias routes to ``alias@vN`` (the deployed adapter, a new engine-side name per
version, since vLLM caches by name) or to its base model. Every replica refreshes
the alias table from the database twice a second, so a deployment made through
any replica is followed by all of them within 1 s. Runtime-loaded adapters vanish
when an engine restarts; :meth:`Router.reconcile` loads them again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.errors import InvalidRequest, NotFound, UpstreamError
from proxy.metrics import Metrics
from proxy.upstream import Upstream
from storage.keys import ensure_project
from storage.models import Adapter, Alias, Deployment

log = logging.getLogger("onthejob.routing")


@dataclass(frozen=True)
class Route:
    alias: str
    served_model: str
    version: int | None
    base_model: str


def lora_name(project: str, alias: str, version: int) -> str:
    """The engine-side name of an adapter version (never reused)."""
    return f"{alias}@v{version}" if project == "default" else f"{project}~{alias}@v{version}"


class Router:
    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], upstream: Upstream, metrics: Metrics, default_project: str
    ) -> None:
        self.sessionmaker = sessionmaker
        self.upstream = upstream
        self.metrics = metrics
        self.default_project = default_project
        self.base_models: set[str] = set()
        self._aliases: dict[tuple[str, str], tuple[str, int | None]] = {}
        self._paths: dict[tuple[str, str, int], str] = {}
        self._lock = asyncio.Lock()

    # ---- discovery and the alias table ------------------------------------------------
    async def discover(self) -> None:
        """Learn the engines' base models (models without a parent)."""
        for base in self.upstream.urls:
            try:
                status, body = await self.upstream.get_json(base, "/v1/models")
            except Exception as exc:  # noqa: BLE001 - an engine still starting is not fatal
                log.warning("engine %s not reachable yet: %s", base, exc)
                continue
            if status == 200:
                self.base_models |= {m["id"] for m in body.get("data", []) if not m.get("parent")}

    async def register_base_aliases(self) -> None:
        """Each engine's base model becomes an alias of the default project, so /v1/models answers at once."""
        async with self.sessionmaker() as db:
            await db.run_sync(lambda s: ensure_project(s, self.default_project))
            existing = set(await db.scalars(select(Alias.name).where(Alias.project_id == self.default_project)))
            for name in sorted(self.base_models - existing):
                db.add(Alias(project_id=self.default_project, name=name, base_model=name))
            await db.commit()

    async def refresh(self) -> None:
        async with self.sessionmaker() as db:
            rows = (
                await db.execute(select(Alias.project_id, Alias.name, Alias.base_model, Alias.deployed_version))
            ).all()
        self._aliases = {(p, n): (b, v) for p, n, b, v in rows}

    def resolve(self, project: str, name: Any) -> Route:
        """The route for a model name as the client sent it."""
        if not isinstance(name, str) or not name:
            raise InvalidRequest("'model' is required: pass an alias from GET /v1/models", param="model")
        hit = self._aliases.get((project, name))
        if hit is not None:
            base, version = hit
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

    # ---- adapters in engines ----------------------------------------------------------
    async def _adapter_path(self, project: str, alias: str, version: int) -> str:
        key = (project, alias, version)
        if key not in self._paths:
            async with self.sessionmaker() as db:
                row = await db.scalar(
                    select(Adapter).where(
                        Adapter.project_id == project, Adapter.alias == alias, Adapter.version == version
                    )
                )
            if row is None:
                raise NotFound(
                    f"no adapter {alias!r} version {version} in this project: list them at GET /v1/admin/adapters",
                    param="version",
                )
            self._paths[key] = row.path
        return self._paths[key]

    async def ensure_loaded(self, base: str, project: str, alias: str, version: int) -> None:
        """Load ``alias@vN`` into one engine unless it is there already, then verify it is listed."""
        name = lora_name(project, alias, version)
        status, body = await self.upstream.get_json(base, "/v1/models")
        if status == 200 and name in {m["id"] for m in body.get("data", [])}:
            return
        path = await self._adapter_path(project, alias, version)
        status, body = await self.upstream.post_json(
            base, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}
        )
        if status != 200 and "already" not in str(body):
            self.metrics.adapter_loads.labels("failed").inc()
            raise UpstreamError(f"engine {base} refused adapter {name} from {path}: {body}")
        status, body = await self.upstream.get_json(base, "/v1/models")
        if status != 200 or name not in {m["id"] for m in body.get("data", [])}:
            self.metrics.adapter_loads.labels("failed").inc()
            raise UpstreamError(f"engine {base} does not list adapter {name} after loading it")
        self.metrics.adapter_loads.labels("ok").inc()

    async def deploy(self, project: str, alias: str, version: int | None) -> dict[str, Any]:
        """Load into every replica, verify, then switch routing (and record the deployment)."""
        async with self._lock:
            async with self.sessionmaker() as db:
                row = await db.scalar(select(Alias).where(Alias.project_id == project, Alias.name == alias))
                adapter = None
                if version is not None:
                    adapter = await db.scalar(
                        select(Adapter).where(
                            Adapter.project_id == project, Adapter.alias == alias, Adapter.version == version
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
                    db.add(row)
            previous = row.deployed_version
            try:
                if version is not None:
                    await asyncio.gather(*(self.ensure_loaded(b, project, alias, version) for b in self.upstream.urls))
            except Exception as exc:
                async with self.sessionmaker() as db:
                    db.add(
                        Deployment(
                            project_id=project,
                            alias=alias,
                            version=version,
                            previous_version=previous,
                            status="failed",
                            detail={"error": str(exc)},
                        )
                    )
                    await db.commit()
                raise
            async with self.sessionmaker() as db:
                live = await db.scalar(select(Alias).where(Alias.project_id == project, Alias.name == alias))
                if live is None:
                    live = Alias(project_id=project, name=alias, base_model=row.base_model)
                    db.add(live)
                live.deployed_version = version
                dep = Deployment(
                    project_id=project,
                    alias=alias,
                    version=version,
                    previous_version=previous,
                    status="active",
                    detail={"replicas": len(self.upstream.urls)},
                )
                db.add(dep)
                await db.commit()
                result = {
                    "id": dep.id,
                    "alias": alias,
                    "version": version,
                    "previous_version": previous,
                    "served_model": lora_name(project, alias, version) if version else live.base_model,
                    "status": "active",
                }
            self._aliases[(project, alias)] = (row.base_model, version)
            return result

    async def reconcile(self, base: str) -> int:
        """Reload every deployed adapter this engine lost (after a restart). Returns how many were loaded."""
        status, body = await self.upstream.get_json(base, "/v1/models")
        if status != 200:
            return 0
        present = {m["id"] for m in body.get("data", [])}
        loaded = 0
        for (project, alias), (_, version) in list(self._aliases.items()):
            if version is not None and lora_name(project, alias, version) not in present:
                await self.ensure_loaded(base, project, alias, version)
                loaded += 1
        return loaded
