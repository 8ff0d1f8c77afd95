"""Feedback and session routes through a small app: the router, the error envelope, real Postgres.

The caller's project comes from a test header in place of an API key; the
database session from the real (migrated) Postgres.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from proxy.auth import Principal
from proxy.deps import current_principal, db_session
from proxy.errors import ApiError
from proxy.routes_feedback import router
from storage.db import async_engine, sync_engine
from storage.models import Feedback
from tests.storage.rows import GEN, NL, choice, insert, msg, new_project, row

pytestmark = pytest.mark.anyio
P1 = msg("user", 40) + GEN


@dataclass
class World:
    a: str
    b: str
    a1: str  # project a, session "s1", first call
    a2: str  # its second turn
    b1: str  # project b, session "s1" too


@pytest.fixture
def world(pg_url: str) -> Iterator[World]:
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        a, b = new_project(db), new_project(db)
        a1, a2, b1 = (f"cmpl-{uuid.uuid4().hex[:12]}" for _ in range(3))
        q2 = P1 + [50, 2] + [NL, *msg("tool", 60), *GEN]
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "x"},
            {"role": "tool", "content": "42"},
        ]
        insert(
            db,
            row(a1, P1, [choice([50, 2])], project=a, task="t", crid="req-1", adapter=1),
            row(a2, q2, [choice([52, 2])], project=a, task="t", parent=a1, messages=messages, at=1, adapter=1),
            row(b1, P1, [choice([51, 2])], project=b),
        )
        db.commit()
    yield World(a, b, a1, a2, b1)
    eng.dispose()


@pytest.fixture
async def client(pg_url: str) -> AsyncIterator[httpx.AsyncClient]:
    eng = async_engine(pg_url, poolclass=NullPool)
    maker = async_sessionmaker(eng, expire_on_commit=False)
    app = FastAPI()
    app.include_router(router)

    @app.exception_handler(ApiError)
    async def envelope(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def principal(request: Request) -> Principal:
        return Principal(project_id=request.headers["x-test-project"], role="harness", key_id=None)

    async def session() -> AsyncIterator[AsyncSession]:
        async with maker() as db:
            yield db

    app.dependency_overrides[current_principal] = principal
    app.dependency_overrides[db_session] = session
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    await eng.dispose()


def as_(project: str) -> dict[str, str]:
    return {"x-test-project": project}


async def count(pg_url: str, project: str) -> int:
    eng = async_engine(pg_url, poolclass=NullPool)
    async with AsyncSession(eng) as db:
        n = await db.scalar(select(func.count()).select_from(Feedback).where(Feedback.project_id == project))
    await eng.dispose()
    return int(n or 0)


def fb(target: dict[str, str], name: str = "thumbs", value: Any = True, **extra: Any) -> dict[str, Any]:
    return {"target": target, "name": name, "value": value, **extra}


async def test_known_target_attaches_201_unknown_pends_202(client: httpx.AsyncClient, world: World) -> None:
    r = await client.post("/v1/feedback", json=fb({"completion_id": world.a1}), headers=as_(world.a))
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["status"], body["completion_id"], body["session_id"], body["value"]) == (
        "attached",
        world.a1,
        "s1",
        True,
    )
    r = await client.post("/v1/feedback", json=fb({"client_request_id": "req-later"}), headers=as_(world.a))
    assert (r.status_code, r.json()["status"], r.json()["completion_id"]) == (202, "pending", None)


async def test_another_projects_ids_look_unknown(client: httpx.AsyncClient, world: World) -> None:
    foreign = await client.post("/v1/feedback", json=fb({"completion_id": world.b1}, id="k"), headers=as_(world.a))
    unknown = await client.post("/v1/feedback", json=fb({"completion_id": "cmpl-none"}, id="k2"), headers=as_(world.a))
    assert foreign.status_code == unknown.status_code == 202
    strip = ("id", "target", "idempotency_key", "created_at")
    assert {k: v for k, v in foreign.json().items() if k not in strip} == {
        k: v for k, v in unknown.json().items() if k not in strip
    }
    for path in (f"/v1/sessions/{world.b1}", "/v1/sessions/nope", "/v1/sessions/nope/trajectories"):
        r = await client.get(path, headers=as_(world.a))
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # Project b's session "s1" never shows project a's feedback, and the reverse.
    r = await client.get("/v1/feedback", params={"completion_id": world.b1}, headers=as_(world.b))
    assert r.json()["data"] == []
    r = await client.get("/v1/sessions/s1", headers=as_(world.b))
    assert [c["id"] for c in r.json()["completions"]] == [world.b1] and r.json()["feedback"] == []


async def test_batches_in_both_forms(client: httpx.AsyncClient, world: World) -> None:
    known = [fb({"session_id": "s1"}, "outcome", "success"), fb({"completion_id": world.a2}, "reward", 0.5)]
    r = await client.post("/v1/feedback", json={"feedback": known}, headers=as_(world.a))
    assert r.status_code == 201 and [i["status"] for i in r.json()["data"]] == ["attached", "attached"]
    mixed = [*known, {"target": {"session_id": "s-later"}, "name": "review", "comment": "late and long"}]
    r = await client.post("/v1/feedback", json=mixed, headers=as_(world.a))
    assert r.status_code == 202 and [i["status"] for i in r.json()["data"]] == ["attached", "attached", "pending"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"target": {"session_id": "s1"}, "name": "x"}, "value"),
        (fb({"session_id": "s1"}, value=[1, 2]), "value"),
        (fb({"session_id": "s1", "completion_id": "c"}), "target"),
        (fb({"session_id": "s1"}, comment="x" * 20_000), "comment"),
        ({"target": {"session_id": "s1"}, "value": 1}, "name"),
        ({"feedback": [fb({"session_id": "s1"}), fb({"session": "s1"})]}, "feedback[1].target.session"),
    ],
)
async def test_bad_feedback_is_a_400_envelope_and_stores_nothing(
    client: httpx.AsyncClient, world: World, pg_url: str, body: Any, param: str
) -> None:
    r = await client.post("/v1/feedback", json=body, headers=as_(world.a))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert param.split(".")[-1] in error["message"]
    assert await count(pg_url, world.a) == 0


async def test_invalid_json_and_bad_queries(client: httpx.AsyncClient, world: World) -> None:
    r = await client.post("/v1/feedback", content=b"{not json", headers=as_(world.a))
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = await client.get("/v1/feedback", headers=as_(world.a))  # no filter: the project's newest feedback
    assert r.status_code == 200 and isinstance(r.json()["data"], list)


async def test_idempotent_retry_and_conflict(client: httpx.AsyncClient, world: World, pg_url: str) -> None:
    body = fb({"client_request_id": "req-1"}, id="retry-1")
    first = await client.post("/v1/feedback", json=body, headers=as_(world.a))
    second = await client.post("/v1/feedback", json=body, headers=as_(world.a))
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    r = await client.post("/v1/feedback", json={**body, "value": False}, headers=as_(world.a))
    assert r.status_code == 409 and r.json()["error"]["param"] == "id"
    assert await count(pg_url, world.a) == 1


async def test_history_session_view_and_trajectories(client: httpx.AsyncClient, world: World) -> None:
    for value in (False, True):  # a revision: the user changed their mind
        r = await client.post(
            "/v1/feedback", json=fb({"session_id": "s1"}, value=value, source="user"), headers=as_(world.a)
        )
        assert r.status_code == 201
    note = {"target": {"completion_id": world.a1}, "name": "note", "comment": "hm"}
    assert (await client.post("/v1/feedback", json=note, headers=as_(world.a))).status_code == 201
    history = (await client.get("/v1/feedback", params={"session_id": "s1"}, headers=as_(world.a))).json()["data"]
    assert [(f["name"], f["value"], f["current"]) for f in history] == [
        ("thumbs", False, False),
        ("thumbs", True, True),
        ("note", None, True),
    ]
    on_call = (await client.get("/v1/feedback", params={"completion_id": world.a1}, headers=as_(world.a))).json()
    assert [f["name"] for f in on_call["data"]] == ["note"]

    view = (await client.get("/v1/sessions/s1", headers=as_(world.a))).json()
    assert (view["object"], view["task_id"]) == ("session", "t")
    assert [(c["id"], c["parent_id"], c["n"]) for c in view["completions"]] == [
        (world.a1, None, 1),
        (world.a2, world.a1, 1),
    ]
    assert len(view["feedback"]) == 3

    r = await client.get("/v1/sessions/s1/trajectories", headers=as_(world.a))
    [t] = r.json()["data"]
    assert t["completion_ids"] == [world.a1, world.a2] and t["reward"] == 1.0 and t["group"] == "t"
    assert t["token_ids"] == P1 + [50, 2] + [NL, *msg("tool", 60), *GEN] + [52, 2]
    assert t["mask"] == [0] * 9 + [1, 1] + [0] * 10 + [1, 1]
    assert t["adapters"] == [1, 1] and t["reward_detail"]["scope"] == "session"


async def test_session_ids_may_contain_slashes(client: httpx.AsyncClient, world: World, pg_url: str) -> None:
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        insert(db, row(f"cmpl-{uuid.uuid4().hex[:12]}", P1, [choice([50, 2])], project=world.a, session="team/a"))
        db.commit()
    eng.dispose()
    assert (await client.get("/v1/sessions/team/a", headers=as_(world.a))).json()["id"] == "team/a"
    [t] = (await client.get("/v1/sessions/team/a/trajectories", headers=as_(world.a))).json()["data"]
    assert t["session_id"] == "team/a" and t["reward"] is None and t["reward_detail"]["excluded"] == "ungraded"


async def test_feedback_text_goes_through_the_projects_redaction_policy(client: httpx.AsyncClient, pg_url: str) -> None:
    secret = "sk-PLANTEDfeedback0123456789"
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        patterns = new_project(db, {"redact": {"patterns": ["sk-[A-Za-z0-9]+"]}})
        no_text = new_project(db, {"redact": {"store_text": False}})
        db.commit()
    for project in (patterns, no_text):
        item = fb(
            {"session_id": "s-redact"},
            "outcome",
            "success",
            comment=f"leaked {secret} in the answer",
            metadata={"note": f"customer pasted {secret}"},
            id="r1",
        )
        r = await client.post("/v1/feedback", json=item, headers=as_(project))
        assert r.status_code == 202, r.text
        assert secret not in r.text
        label = await client.post(
            "/v1/feedback", json=fb({"session_id": "s-redact"}, "label", secret, id="r2"), headers=as_(project)
        )
        assert label.status_code == 202 and secret not in label.text
        again = await client.post("/v1/feedback", json=item, headers=as_(project))  # an idempotent retry
        assert again.status_code == 202 and again.json()["id"] == r.json()["id"]
    with Session(eng) as db:
        rows = db.scalars(select(Feedback).where(Feedback.project_id.in_([patterns, no_text]))).all()
    eng.dispose()
    stored = repr([(f.comment, f.value, f.meta) for f in rows])
    assert len(rows) == 4 and secret not in stored, stored
    by_project = {f.project_id: f for f in rows if f.name == "outcome"}
    assert by_project[patterns].comment == "leaked [redacted] in the answer"
    assert by_project[no_text].comment == "[redacted]" and by_project[no_text].value == "success"


async def test_feedback_on_one_choice_grades_that_choice_and_makes_a_preference_pair(
    client: httpx.AsyncClient, pg_url: str, tmp_path: Any
) -> None:
    import json

    from onthejob.cli import main

    cid = f"cmpl-{uuid.uuid4().hex[:12]}"
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        p = new_project(db)
        ask = [{"role": "user", "content": "What is 2+3?"}]
        insert(
            db,
            row(
                cid,
                P1,
                [choice([53, 2], index=0, content="5"), choice([54, 2], index=1, content="six")],
                project=p,
                session="n2",
                messages=ask,
            ),
        )
        db.commit()
    eng.dispose()
    for k, value in ((0, 1.0), (1, 0.0)):
        r = await client.post(
            "/v1/feedback", json=fb({"completion_id": cid, "choice": k}, "reward", value), headers=as_(p)
        )
        assert r.status_code == 201, r.text
        assert r.json()["target"] == {"completion_id": cid, "choice": k}
    bad = await client.post("/v1/feedback", json=fb({"session_id": "n2", "choice": 0}), headers=as_(p))
    assert bad.status_code == 400 and "choice" in bad.text
    got = (await client.get("/v1/sessions/n2/trajectories", headers=as_(p))).json()["data"]
    assert {t["id"]: t["reward"] for t in got} == {f"{cid}:0": 1.0, f"{cid}:1": 0.0}
    out = tmp_path / "dpo.jsonl"
    assert main(["export", "--format", "dpo", "--project", p, "--db", pg_url, "-o", str(out)]) == 0
    (pair,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert pair["prompt"] == ask
    assert pair["chosen"][0]["content"] == "5" and pair["rejected"][0]["content"] == "six"
