"""A call runs on its few collaborators (no app state), and a dialect plugs in where the reply is made.

The toy dialect below is what a Responses or Anthropic adapter does (proxy/dialects/base.py):
it translates the request into a chat body, and each reply or stream chunk back, while
the capture, the spool record and session linking stay the chat path's. The fake
engine is enough here: what is checked is the plumbing, not the engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker

from proxy.calls import ProxiedCall
from proxy.dialects.base import Dialect, DialectStream, Exchange, Stored, StreamEnd, sse
from proxy.dialects.responses import ResponsesDialect
from proxy.errors import ApiError
from proxy.link_keys import Naming, prefix_keys
from proxy.metrics import Metrics
from proxy.policies import Policies
from proxy.recording import Recording
from proxy.routing import Router
from proxy.served import Route
from proxy.sessions import Linker, SessionRef
from proxy.spool import Spool, read_segment
from proxy.upstream import Upstream
from storage.db import async_engine

pytestmark = pytest.mark.anyio


class ShoutStream(DialectStream):
    def __init__(self) -> None:
        self.text: list[str] = []
        self.ids: list[int] = []
        self.body: dict[str, Any] | None = None

    def open(self) -> bytes:
        return sse("shout.open", {})

    def feed(self, chunk: dict[str, Any]) -> bytes:
        for choice in chunk.get("choices") or ():
            self.ids += choice.get("token_ids") or []  # capture fields are still there
        text = "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or ())
        self.text.append(text)
        return sse("shout.delta", {"text": text.upper()}) if text else b""

    def close(self, end: StreamEnd) -> bytes:
        self.body = {"type": "shout", "text": "".join(self.text).upper(), "end": end.termination}
        return sse("shout.done", self.body)

    @property
    def result(self) -> dict[str, Any] | None:
        return self.body


class Shout(Dialect):
    """A toy dialect: ``{"input": text}`` in, upper-cased text out, in its own events."""

    name = "shout"
    paths = ("/v1/shout",)
    id_prefix = "shout_"

    def to_chat(self, body: dict[str, Any], previous: Stored | None) -> dict[str, Any]:
        chat = {"model": body["model"], "messages": [{"role": "user", "content": body["input"]}]}
        return chat | {k: body[k] for k in ("max_tokens", "stream") if k in body}

    def reply(self, chat: dict[str, Any], ex: Exchange) -> dict[str, Any]:
        return {
            "id": ex.id,
            "type": "shout",
            "text": chat["choices"][0]["message"]["content"].upper(),
            "ids": chat["choices"][0]["token_ids"],
        }

    def stream(self, ex: Exchange) -> DialectStream:
        return ShoutStream()

    def error(self, exc: ApiError) -> tuple[int, dict[str, Any]]:
        return exc.status, {"shout_error": exc.message}


SHOUT = Shout()


@pytest.fixture
async def parts(stub_upstream: str, tmp_path: Path) -> AsyncIterator[tuple[Upstream, Router, Recording, Spool]]:
    upstream = Upstream([stub_upstream], connect_timeout=5, idle_timeout=10)
    engine = async_engine(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}")
    maker = async_sessionmaker(engine, expire_on_commit=False)
    metrics = Metrics()
    spool = Spool(tmp_path / "spool", 10**9)
    policies = Policies(tmp_path)
    policies.update({})  # the database answered: no project asked for redaction
    recording = Recording(
        spool,
        Linker(spool, maker),
        metrics,
        enabled=True,
        full_policy="refuse",
        wake_at=10**6,
        wake=asyncio.Event(),
        policies=policies,
    )
    yield upstream, Router(maker, upstream, metrics, "default"), recording, spool
    spool.close()
    await upstream.close()
    await engine.dispose()


def new_call(parts: tuple[Upstream, Router, Recording, Spool], client: dict[str, Any]) -> ProxiedCall:
    upstream, router, recording, _ = parts
    body = SHOUT.to_chat(client, None)  # the edge translation
    keys = prefix_keys(body["messages"])
    return ProxiedCall(
        upstream,
        router,
        recording,
        project="default",
        endpoint="chat",
        body=body,
        route=Route("m", "stub-model", None, "stub-model"),
        naming=Naming("ses_seam", None, (), None, "header"),
        session=SessionRef("ses_seam", "header", None, None),
        prompt_key=keys[-1],
        dialect=SHOUT,
        client_request=client,
    )


async def test_a_non_streamed_reply_goes_through_the_dialect_and_the_record_keeps_both_sides(parts: Any) -> None:
    client = {"model": "m", "input": "hi", "max_tokens": 3}
    call = new_call(parts, client)
    assert call.id.startswith("shout_")
    response = await call.complete(await call.open())
    sent = orjson.loads(response.body)
    assert sent == {"id": call.id, "type": "shout", "text": "XXX", "ids": [100, 101, 102]}
    assert response.headers["x-request-id"] == call.id
    (record,) = read_segment(parts[3].folder / "active.jsonl")
    stored = record.row()
    assert stored["dialect"] == "shout"
    assert stored["client_request"] == client and stored["client_response"] == sent  # what the harness saw
    assert stored["request"]["messages"] == [{"role": "user", "content": "hi"}]  # the engine-facing chat call
    assert stored["response"]["choices"][0]["token_ids"] is None  # stripped as vLLM would for that chat body
    assert stored["choices"][0]["token_ids"] == [100, 101, 102]  # the engine's tokens, captured
    assert stored["choices"][0]["logprobs"] == [-0.5, -0.5, -0.5]
    assert stored["prompt_token_ids"] == list(range(1, 17))


async def test_a_stream_is_translated_chunk_by_chunk_and_recorded_through_the_finish_callback(parts: Any) -> None:
    call = new_call(parts, {"model": "m", "input": "hi", "max_tokens": 4, "stream": True})
    streamed = call.stream(await call.open())
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await streamed({"type": "http"}, receive, send)
    body = b"".join(m.get("body", b"") for m in sent)
    assert body.startswith(b"event: shout.open") and body.count(b"event: shout.delta") == 4
    assert body.endswith(b"event: shout.done\ndata: " + orjson.dumps(streamed.dialect[1].result) + b"\n\n")  # type: ignore[index]
    assert b"[DONE]" not in body
    (record,) = read_segment(parts[3].folder / "active.jsonl")
    stored = record.row()
    assert stored["stream"] is True and stored["termination"] == "length"
    assert stored["choices"][0]["token_ids"] == [100, 101, 102, 103]
    assert stored["client_response"] == {"type": "shout", "text": "XXXX", "end": "length"}
    assert stored["ttft_ms"] is not None


async def test_a_redacted_projects_dialect_record_is_walked_from_the_bytes_its_client_got(parts: Any) -> None:
    """The client's body is recorded as the bytes sent; a policy that walks it gets it parsed back, and only
    the record is redacted (here: the instructions a Response echoes)."""
    parts[2].policies.update({"default": {"redact": {"patterns": ["sk-[0-9]+"]}}})
    responses = ResponsesDialect()
    for stream in (False, True):
        client = {"model": "m", "input": "hi", "instructions": "key sk-123", "max_output_tokens": 3, "stream": stream}
        body = responses.to_chat(client, None)
        call = ProxiedCall(
            *parts[:3],
            project="default",
            endpoint="chat",
            body=body,
            route=Route("m", "stub-model", None, "stub-model"),
            naming=Naming("ses_seam", None, (), None, "header"),
            session=SessionRef("ses_seam", "header", None, None),
            prompt_key=prefix_keys(body["messages"])[-1],
            dialect=responses,
            client_request=client,
            raw_body=json.dumps(client).encode(),
        )
        if stream:
            streamed = call.stream(await call.open())
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                await asyncio.Event().wait()
                return {}

            async def send(message: dict[str, Any], into: list[dict[str, Any]] = sent) -> None:
                into.append(message)

            await streamed({"type": "http"}, receive, send)
            last = b"".join(m.get("body", b"") for m in sent).rsplit(b"\ndata: ", 1)[1]
            got = orjson.loads(last)["response"]
        else:
            got = orjson.loads((await call.complete(await call.open())).body)
        assert got["instructions"] == "key sk-123" and got["output"][0]["content"][0]["text"] == "xxx"
        stored = next(r for r in read_segment(parts[3].folder / "active.jsonl") if r.id == call.id).row()
        assert stored["client_response"] == {**got, "instructions": "key [redacted]"}
        assert stored["client_request"]["instructions"] == "key [redacted]"


async def test_the_clients_body_is_recorded_as_the_bytes_it_sent_unless_they_cannot_be_or_redaction_changed_it(
    parts: Any,
) -> None:
    """Not parsed and serialised again: the bytes the client sent are the column, when they can sit inside a
    spool line and a COPY row (no tab, newline or return between tokens) and no policy rewrote the body."""
    body = {"model": "m", "messages": [{"role": "user", "content": 'héllo "sk-42"\n'}], "max_tokens": 2}

    async def recorded(sent: bytes, dialect: Any = None) -> Any:
        client = None
        chat = body
        if dialect is not None:
            client, chat = orjson.loads(sent), dialect.to_chat(orjson.loads(sent), None)
        call = ProxiedCall(
            *parts[:3],
            project="default",
            endpoint="chat",
            body=chat if client else orjson.loads(sent),
            route=Route("m", "stub-model", None, "stub-model"),
            naming=Naming("ses_seam", None, (), None, "header"),
            session=SessionRef("ses_seam", "header", None, None),
            prompt_key=prefix_keys(chat["messages"])[-1],
            dialect=dialect,
            client_request=client,
            raw_body=sent,
        )
        await call.complete(await call.open())
        (line,) = [x for x in (parts[3].folder / "active.jsonl").read_bytes().splitlines() if call.id.encode() in x]
        return line, orjson.loads(line)["completion"]

    as_the_sdk_sends = json.dumps(body).encode()  # ", " and ": " between tokens
    line, stored = await recorded(as_the_sdk_sends)
    assert b'"request":' + as_the_sdk_sends + b"," in line and stored["request"] == body
    pretty = json.dumps(body, indent=2).encode()
    line, stored = await recorded(pretty)
    assert b'"request":' + orjson.dumps(body) + b"," in line and stored["request"] == body
    responses = ResponsesDialect()
    client = json.dumps({"model": "m", "input": "hi", "max_output_tokens": 2}).encode()
    line, stored = await recorded(client, responses)
    assert b'"client_request":' + client + b"," in line
    assert stored["request"]["messages"] == [{"role": "user", "content": "hi"}]
    parts[2].policies.update({"default": {"redact": {"patterns": ["sk-[0-9]+"]}}})
    line, stored = await recorded(as_the_sdk_sends)
    assert stored["request"]["messages"][0]["content"] == 'héllo "[redacted]"\n' and b"sk-42" not in line
    # What the recorder writes of these lines (a spool read back) is the same JSON.
    assert [r.row()["request"]["max_tokens"] for r in read_segment(parts[3].folder / "active.jsonl")] == [2] * 4
