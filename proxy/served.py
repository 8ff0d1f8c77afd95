"""What a call is served by: an adapter version's engine-side name, the route a call takes to it,
the versions the engines must hold, and a version's committed row."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.models import Adapter

VersionKey = tuple[str, str, int]  # (project, alias, version)
LORA_NAME = re.compile(r"(?:(?P<project>[^~]+)~)?(?P<alias>.+)@v(?P<version>\d+)")


async def committed_adapter(
    sessionmaker: async_sessionmaker[AsyncSession], project: str, alias: str, version: int
) -> Adapter | None:
    """The adapter version's row, once its publish committed (a reserved row names no weights yet)."""
    async with sessionmaker() as db:
        return await db.scalar(
            select(Adapter).where(
                Adapter.project_id == project,
                Adapter.alias == alias,
                Adapter.version == version,
                Adapter.committed(),
            )
        )


@dataclass(frozen=True)
class Route:
    alias: str
    served_model: str
    version: int | None
    base_model: str
    sha256: str | None = None  # the adapter version's content hash (recorded with each call; proxy/promotion.py)


def lora_name(project: str, alias: str, version: int) -> str:
    """The engine-side name of an adapter version (never reused)."""
    return f"{alias}@v{version}" if project == "default" else f"{project}~{alias}@v{version}"


def needed_versions(
    aliases: Mapping[tuple[str, str], tuple[str, int | None]], pinned: Iterable[VersionKey] = ()
) -> set[VersionKey]:
    """The adapter versions engines must hold: every routed version, plus ``pinned`` ones.

    Today nothing is pinned. Promotion adds here what must stay loaded without taking
    all of an alias's traffic: a canary's candidate, a held candidate, a version whose
    evaluation is pending. Every proxy worker must compute the same set (fill
    :attr:`proxy.routing.Router.pinned` from the database in :meth:`proxy.routing.Router.refresh`), or one worker
    unloads what another routes to. Anything else the proxy loaded is unloaded.
    """
    return {(p, a, v) for (p, a), (_, v) in aliases.items() if v is not None} | set(pinned)
