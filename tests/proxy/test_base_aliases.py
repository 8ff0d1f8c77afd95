"""Workers starting together (``serve --workers N``) each register the engines' base models as aliases:
one of them inserts the rows, the others find them; none fails its start over it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from proxy.metrics import Metrics
from proxy.routing import Router
from proxy.upstream import Upstream
from storage.db import async_engine
from storage.models import Alias

pytestmark = pytest.mark.anyio


async def test_workers_starting_together_register_each_base_alias_once(pg_factory: Any) -> None:
    engine = async_engine(pg_factory())
    maker = async_sessionmaker(engine, expire_on_commit=False)
    routers = [
        Router(maker, Upstream(["http://127.0.0.1:9"], connect_timeout=1, idle_timeout=1), Metrics(), "default")
        for _ in range(4)
    ]
    for router in routers:
        router.base_models = {"model-a", "model-b"}  # what each worker's discovery found on the engines
    try:
        await asyncio.gather(*(router.register_base_aliases() for router in routers))  # raises on a lost race
        async with maker() as db:
            names = list(await db.scalars(select(Alias.name).where(Alias.project_id == "default")))
    finally:
        await engine.dispose()
    assert sorted(names) == ["model-a", "model-b"]
