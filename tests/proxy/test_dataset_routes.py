"""The dataset admin routes through the app's error envelope: create (201, 409, 400), list, show, diff, per project."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from proxy import routes_datasets
from proxy.app import create_app
from proxy.settings import Settings
from storage.dataset_jobs import APPLICATION_NAME, DatasetWorker
from storage.db import sync_engine
from storage.keys import ensure_project
from tests.proxy.header_auth import as_, header_client
from tests.storage.test_datasets import _world

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(pg_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The real app (routes, envelope); the key check and the database session are the test's."""
    app = create_app(Settings(upstreams=["http://127.0.0.1:1"], database_url=pg_url))
    worker = DatasetWorker(pg_url, lambda: pytest.fail("a database other processes see is worked on in one"))
    app.dependency_overrides[routes_datasets.dataset_worker] = lambda: worker  # (no lifespan here)
    async with header_client(app, pg_url, "http://t/v1/admin") as c:
        yield c
    worker.close()


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


async def test_a_dataset_is_made_in_a_process_of_its_own_and_a_dead_one_is_replaced(
    client: httpx.AsyncClient, db: Session, pg_url: str
) -> None:
    """The creation (every candidate session assembled) runs in the worker's dataset process, not in a thread
    sharing the serving loop's GIL: held there by a lock on its table, the job is seen in Postgres under the
    child's name while the loop answers; the child killed, the call under way gets a 503 in the envelope,
    nothing is half-written, and the next call starts another child that makes it."""
    p, _ = _world(db)
    db.commit()
    blocker = sync_engine(pg_url)
    try:
        with blocker.connect() as conn:
            conn.execute(text("LOCK TABLE datasets IN EXCLUSIVE MODE"))  # a plain read still passes
            before = {c.pid for c in multiprocessing.active_children()}  # another test's, maybe still ending
            making = asyncio.create_task(client.post("/datasets", headers=as_(p), json={"name": "big"}))
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = :n AND wait_event_type = 'Lock'"
            for _ in range(300):
                with blocker.connect() as probe:
                    if probe.execute(text(waiting), {"n": APPLICATION_NAME}).scalar_one():
                        break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the dataset process never reached the table")
            assert not making.done()
            assert (await client.get("http://t/healthz")).status_code == 200  # the loop serves meanwhile
            children = [c for c in multiprocessing.active_children() if c.pid not in before]
            assert len(children) == 1 and children[0].pid != os.getpid()
            children[0].kill()
            gone = await making
            conn.rollback()
    finally:
        blocker.dispose()
    assert gone.status_code == 503 and gone.json()["error"]["type"], gone.text
    assert (await client.get("/datasets", headers=as_(p))).json()["data"] == []  # nothing half-written
    made = await client.post("/datasets", headers=as_(p), json={"name": "big"})
    assert made.status_code == 201 and made.json()["counts"]["trajectories"] == 9  # every trajectory of the world
    assert [c.pid for c in multiprocessing.active_children()] != [children[0].pid]
