"""DELETE /v1/admin/sessions/{id}: gone from routes, export, training batch and mine report; who learned from it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from proxy import routes_admin, routes_feedback
from proxy.errors import ApiError
from storage.db import sync_engine
from storage.export import export_rows
from storage.feed import TrainingFeed
from storage.mine_store import mine, report
from storage.models import (
    Adapter,
    Completion,
    EndUserTombstone,
    Tombstone,
    TrainingRun,
    TrainingStep,
    UsedFeedback,
)
from tests.proxy import test_feedback_routes
from tests.proxy.header_auth import as_, header_client
from tests.proxy.test_feedback_routes import World
from tests.storage.rows import choice, feedback_row, insert, row

pytestmark = pytest.mark.anyio
world = test_feedback_routes.world  # the fixture: two projects, each with a session "s1"


@pytest.fixture
async def client(pg_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.include_router(routes_feedback.router)
    app.include_router(routes_admin.router)

    @app.exception_handler(ApiError)
    async def envelope(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async with header_client(app, pg_url, "http://t") as c:
        yield c


def _trained(db: Session, project: str, trajectory_id: str) -> None:
    """v1 trained on the trajectory; v2 trained on top of v1 (inherits it); v3 from the base."""
    run = TrainingRun(project_id=project, alias="agent", objective="tis", base_model="tiny")
    db.add(run)
    db.flush()
    step = TrainingStep(run_id=run.id, step=1, adapter_version=1)
    db.add(step)
    db.flush()
    db.add(
        UsedFeedback(
            project_id=project,
            alias="agent",
            trajectory_id=trajectory_id,
            feedback_id="fb",
            objective="reward",
            step_id=step.id,
        )
    )
    db.add_all(
        Adapter(
            project_id=project,
            alias="agent",
            version=v,
            parent_version=parent,
            path="/x",
            sha256="0",
            base_model="tiny",
        )
        for v, parent in ((1, None), (2, 1), (3, None))
    )


async def test_a_deleted_session_is_gone_everywhere_and_its_learners_are_named(
    client: httpx.AsyncClient,
    world: World,
    pg_url: str,
) -> None:
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        db.add(feedback_row(world.a, "thumbs", False, session="s1"))
        db.add(feedback_row(world.b, "thumbs", True, session="s1"))
        _trained(db, world.a, f"{world.a2}:0")
        db.commit()
        mine(db, world.a, settle_s=30)
    assert (await client.delete("/v1/admin/sessions/s1", headers=as_(world.a, "harness"))).status_code == 403

    r = await client.delete("/v1/admin/sessions/s1", headers=as_(world.a))
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    assert body["deleted"] == {"calls": 2, "feedback": 1, "dataset_items": 0}
    assert body["adapters"] == [
        {"alias": "agent", "version": 1, "direct": True},
        {"alias": "agent", "version": 2, "direct": False},
    ]

    assert (await client.get("/v1/sessions/s1", headers=as_(world.a))).status_code == 404
    assert (await client.get("/v1/feedback", params={"session_id": "s1"}, headers=as_(world.a))).json()["data"] == []
    with Session(eng) as db:
        rows, read, _ = export_rows(db, world.a, "rl")
        assert (rows, read) == ([], 0)
        assert TrainingFeed(world.a, "agent", settle_s=30).poll(db) == ([], {})
        assert report(db, world.a)["modes"] == {}
        assert export_rows(db, world.b, "rl")[1] == 1  # project b's own "s1" is untouched
    eng.dispose()
    assert (await client.get("/v1/sessions/s1", headers=as_(world.b))).status_code == 200


async def test_lineage_of_a_version_and_who_learned_from_a_session_or_feedback_item(
    client: httpx.AsyncClient, world: World, pg_url: str
) -> None:
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        _trained(db, world.a, f"{world.a2}:0")
        db.commit()
    eng.dispose()
    r = await client.get("/v1/admin/aliases/agent/versions/1/lineage", headers=as_(world.a))
    assert r.status_code == 200
    v1 = r.json()
    assert (v1["parent_version"], v1["ancestors"], v1["trajectories"], v1["feedback"]) == (
        None,
        [],
        [f"{world.a2}:0"],
        ["fb"],
    )
    v2 = (await client.get("/v1/admin/aliases/agent/versions/2/lineage", headers=as_(world.a))).json()
    assert (v2["parent_version"], v2["ancestors"], v2["trajectories"]) == (1, [1], [])  # inherits v1's weights
    assert (await client.get("/v1/admin/aliases/agent/versions/9/lineage", headers=as_(world.a))).status_code == 404
    assert (await client.get("/v1/admin/aliases/agent/versions/1/lineage", headers=as_(world.b))).status_code == 404

    learners = [{"alias": "agent", "version": 1, "direct": True}, {"alias": "agent", "version": 2, "direct": False}]
    # a1 is the first turn of the trained trajectory (leaf a2): it was trained too.
    for query in (
        {"session_id": "s1"},
        {"completion_id": world.a1},
        {"completion_id": world.a2},
        {"feedback_id": "fb"},
    ):
        r = await client.get("/v1/admin/lineage", params=query, headers=as_(world.a))
        assert r.json()["data"] == learners, query
    assert (await client.get("/v1/admin/lineage", params={"session_id": "s1"}, headers=as_(world.b))).json()[
        "data"
    ] == []
    assert (await client.get("/v1/admin/lineage", headers=as_(world.a))).json()["data"] == []


async def test_deleting_an_end_user_deletes_each_of_their_sessions(
    client: httpx.AsyncClient, world: World, pg_url: str
) -> None:
    """Sessions with a call alice made go (s1, s2); bob's stay; v1 learned from s1, v2 inherits it."""
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        db.execute(update(Completion).where(Completion.id == world.a1).values(end_user="alice"))
        insert(
            db,
            row("alice-2", [1], [choice([5, 2])], project=world.a, session="s2", at=5),
            row("bob-1", [1], [choice([5, 2])], project=world.a, session="s3", at=6),
        )
        db.execute(update(Completion).where(Completion.id == "alice-2").values(end_user="alice"))
        db.execute(update(Completion).where(Completion.id == "bob-1").values(end_user="bob"))
        db.add(feedback_row(world.a, "thumbs", True, session="s2", completion="alice-2"))
        _trained(db, world.a, f"{world.a2}:0")
        db.commit()
    assert (await client.delete("/v1/admin/end-users/alice", headers=as_(world.a, "harness"))).status_code == 403

    body = (await client.delete("/v1/admin/end-users/alice", headers=as_(world.a))).json()
    assert (body["sessions"], body["deleted"]) == (["s1", "s2"], {"calls": 3, "feedback": 1, "dataset_items": 0})
    assert body["adapters"] == [
        {"alias": "agent", "version": 1, "direct": True},
        {"alias": "agent", "version": 2, "direct": False},
    ]
    for session, status in (("s1", 404), ("s2", 404), ("s3", 200)):
        assert (await client.get(f"/v1/sessions/{session}", headers=as_(world.a))).status_code == status
    assert (await client.get("/v1/sessions/s1", headers=as_(world.b))).status_code == 200  # another project's
    with Session(eng) as db:
        assert db.scalar(select(EndUserTombstone.end_user).where(EndUserTombstone.project_id == world.a)) == "alice"
        assert set(db.scalars(select(Tombstone.session_id).where(Tombstone.project_id == world.a))) == {"s1", "s2"}
    eng.dispose()
    # Nobody of that name: nothing deleted, and the tombstone still keeps their spooled calls out.
    body = (await client.delete("/v1/admin/end-users/carol", headers=as_(world.a))).json()
    nothing = {"calls": 0, "feedback": 0, "dataset_items": 0}
    assert (body["sessions"], body["deleted"], body["adapters"]) == ([], nothing, [])
