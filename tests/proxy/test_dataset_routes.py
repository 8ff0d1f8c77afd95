"""The dataset admin routes through the app's error envelope: create (201, 409, 400), list, show, diff, per project."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from proxy import routes_datasets
from proxy.app import create_app
from proxy.settings import Settings
from storage import datasets
from storage.db import sync_engine
from storage.keys import ensure_project
from tests.proxy.header_auth import as_, header_client
from tests.storage.test_datasets import _world

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(pg_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The real app (routes, envelope); the key check and the database session are the test's."""
    app = create_app(Settings(upstreams=["http://127.0.0.1:1"], database_url=pg_url))
    engine = sync_engine(pg_url)  # the dataset routes work in a thread, on a sync session (no lifespan here)
    app.dependency_overrides[routes_datasets.sync_engine] = lambda: engine
    async with header_client(app, pg_url, "http://t/v1/admin") as c:
        yield c
    engine.dispose()


async def test_dataset_routes_mirror_the_commands(client: httpx.AsyncClient, db: Session) -> None:
    p, _ = _world(db)
    other = "p-other-datasets"
    ensure_project(db, other)
    db.commit()
    made = await client.post("/datasets", headers=as_(p), json={"name": "good", "filter": {"min_reward": 0.5}})
    assert made.status_code == 201, made.text
    assert made.json()["counts"]["trajectories"] == 5  # four of alias agent, one of alias other
    again = await client.post("/datasets", headers=as_(p), json={"name": "good", "from_mine": "truncated"})
    assert again.status_code == 409 and again.json()["error"]["param"] == "name"
    bad = await client.post("/datasets", headers=as_(p), json={"name": "x", "filter": {"min_reward": "lots"}})
    assert bad.status_code == 400 and "filter.min_reward" in bad.json()["error"]["message"]
    assert (await client.post("/datasets", headers=as_(p, "harness"), json={"name": "h"})).status_code == 403
    cut = await client.post("/datasets", headers=as_(p), json={"name": "cut", "from_mine": "truncated"})
    assert cut.json()["filter"]["kind"] == "mine"

    listed = (await client.get("/datasets", headers=as_(p))).json()["data"]
    assert [(d["name"], d["counts"]["trajectories"]) for d in listed] == [("good", 5), ("cut", 3)]
    shown = (await client.get("/datasets/cut", headers=as_(p))).json()
    assert sorted(i["session_id"] for i in shown["items"]) == ["t1-a", "t1-e", "t3-a"]
    diff = (await client.get("/datasets/good/diff/cut", headers=as_(p))).json()
    assert (len(diff["only_a"]), len(diff["only_b"]), diff["same"]) == (5, 3, 0)

    # A session deleted through its route is gone from the dataset.
    assert (await client.delete("/sessions/t1-a", headers=as_(p))).status_code == 200
    shown = (await client.get("/datasets/cut", headers=as_(p))).json()
    assert sorted(i["session_id"] for i in shown["items"]) == ["t1-e", "t3-a"] and shown["removed"] == 1

    # Another project sees none of it, by name or in its list.
    assert (await client.get("/datasets/cut", headers=as_(other))).status_code == 404
    assert (await client.get("/datasets/good/diff/cut", headers=as_(other))).status_code == 404
    assert (await client.get("/datasets", headers=as_(other))).json()["data"] == []


async def test_a_dataset_is_made_off_the_event_loop_which_serves_meanwhile(
    client: httpx.AsyncClient, db: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The creation (every candidate session assembled) runs in a worker thread: while it is held there,
    the loop answers another request. On the loop (the old ``run_sync``) the held creation blocked it."""
    p, _ = _world(db)
    real, started, release = datasets.create, threading.Event(), threading.Event()
    where: list[threading.Thread] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        where.append(threading.current_thread())
        started.set()
        assert release.wait(20), "the loop never answered the other request"
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "create", held)
    making = asyncio.create_task(client.post("/datasets", headers=as_(p), json={"name": "big"}))
    assert await asyncio.to_thread(started.wait, 20)
    listed = await client.get("/datasets", headers=as_(p))  # served while the creation is held in its thread
    assert listed.status_code == 200 and listed.json()["data"] == []
    release.set()
    made = await making
    assert made.status_code == 201 and made.json()["counts"]["trajectories"] == 9  # every trajectory of the world
    assert where and where[0] is not threading.main_thread()
