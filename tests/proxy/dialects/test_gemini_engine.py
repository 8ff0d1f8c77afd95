"""The Gemini API through the proxy to the real tiny engine, with the unmodified google-genai SDK.

The SDK is pointed at the proxy by its base URL alone (``x-goog-api-key`` is our API key).
No engine has a Gemini route, so the oracle is the engine's own chat call for the request the
Gemini body means (its system instruction, its turns): the same greedy text, and the records
hold the prompt ids and sampled ids the engine gives for it. A forced function call
(``mode: ANY``) → ``functionResponse`` → answer conversation becomes one session and one
trajectory whose sampled tokens are exactly the records'.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from google import genai
from google.genai import types

from engine.launcher import Engine
from tests.proxy.conftest import Proxy, ProxyFactory, make_key

pytestmark = [pytest.mark.engine]

# An enum holds the call's argument to a few tokens (ANY makes the call strict: guided decoding keeps to it).
CALC = types.FunctionDeclaration(
    name="calculator",
    description="Evaluate an arithmetic expression",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        required=["expression"],
        properties={"expression": types.Schema(type=types.Type.STRING, enum=["17*3"])},
    ),
)


@pytest.fixture
def served(start_proxy: ProxyFactory, tiny_engine: Engine, pg_factory: Any) -> tuple[Proxy, str, Engine]:
    db_url = pg_factory()
    return start_proxy(tiny_engine.url, db_url, auth=True), make_key(db_url), tiny_engine


@pytest.fixture
def served_default(start_proxy: ProxyFactory, default_engine: Engine, pg_factory: Any) -> tuple[Proxy, str, Engine]:
    db_url = pg_factory()
    return start_proxy(default_engine.url, db_url, auth=True), make_key(db_url), default_engine


def sdk(proxy: Proxy, key: str) -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=proxy.url))


def record(proxy: Proxy, key: str, completion_id: str) -> dict[str, Any]:
    got = httpx.get(f"{proxy.v1}/chat/completions/{completion_id}", headers={"x-api-key": key}, timeout=10)
    assert got.status_code == 200, got.text
    return got.json()["onthejob"]  # type: ignore[no-any-return]


def engine_chat(engine: Engine, body: dict[str, Any]) -> dict[str, Any]:
    """The engine's own chat call, greedy, with its token ids: the reference."""
    reply = httpx.post(
        f"{engine.url}/v1/chat/completions",
        json={**body, "model": engine.model.name, "temperature": 0, "return_token_ids": True},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def test_generate_stream_and_count_tokens_match_the_engine(served: tuple[Proxy, str, Engine]) -> None:
    proxy, key, engine = served
    client, model = sdk(proxy, key), engine.model.name
    # The tiny model's weights are random: this system instruction and question get visible text from it.
    config = types.GenerateContentConfig(system_instruction="hello", temperature=0, max_output_tokens=12)
    question = "hello"

    reply = client.models.generate_content(model=model, contents=question, config=config)
    assert reply.sdk_http_response is not None and reply.sdk_http_response.headers is not None
    assert reply.response_id == reply.sdk_http_response.headers["x-request-id"]
    messages = [{"role": "system", "content": "hello"}, {"role": "user", "content": question}]
    reference = engine_chat(engine, {"messages": messages, "max_tokens": 12})
    expected = reference["choices"][0]
    assert reply.text == (expected["message"]["content"] or None)
    [candidate] = reply.candidates or []
    assert candidate.finish_reason == (
        types.FinishReason.MAX_TOKENS if expected["finish_reason"] == "length" else types.FinishReason.STOP
    )
    usage = reply.usage_metadata
    assert usage is not None and usage.prompt_token_count == len(reference["prompt_token_ids"])
    assert usage.candidates_token_count == len(expected["token_ids"])

    chunks = list(client.models.generate_content_stream(model=model, contents=question, config=config))
    texts = [c.text for c in chunks if c.text]
    assert len(texts) > 1, "one event per engine chunk, not one buffered at the end"
    assert "".join(texts) == reply.text
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason == candidate.finish_reason
    assert last.usage_metadata is not None and last.usage_metadata.total_token_count == usage.total_token_count
    assert {c.response_id for c in chunks} == {chunks[0].response_id}

    counted = client.models.count_tokens(model=model, contents=question)
    alone = engine_chat(engine, {"messages": [{"role": "user", "content": question}], "max_tokens": 1})
    assert counted.total_tokens == len(alone["prompt_token_ids"])

    proxy.wait_drained()
    assert reply.response_id and chunks[0].response_id
    for completion_id, streamed in ((reply.response_id, False), (chunks[0].response_id, True)):
        rec = record(proxy, key, completion_id)
        assert rec["dialect"] == "gemini" and rec["stream"] is streamed and rec["status_code"] == 200
        assert rec["prompt_token_ids"] == reference["prompt_token_ids"]
        assert rec["completion_token_ids"][0] == expected["token_ids"]
        assert len(rec["logprobs"][0]) == len(expected["token_ids"])
        assert rec["client_request"]["contents"] == [{"role": "user", "parts": [{"text": question}]}]
        assert rec["client_response"]["responseId"] == completion_id
        assert rec["client_response"]["candidates"][0]["content"]["parts"][0]["text"] == reply.text


@pytest.mark.default_model  # the tiny model's random weights never close a call's JSON; SmolLM2 does
def test_forced_function_call_round_trip_is_one_token_exact_trajectory(
    served_default: tuple[Proxy, str, Engine],
) -> None:
    proxy, key, engine = served_default
    client, model = sdk(proxy, key), engine.model.name
    tools: list[Any] = [types.Tool(function_declarations=[CALC]), types.Tool(google_search=types.GoogleSearch())]
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="What is 17 times 3?")])]
    modes = [("ANY", ["calculator"]), ("ANY", None), ("NONE", None)]
    ids, sessions, results = [], set(), []
    for turn, (mode, allowed) in enumerate(modes):
        calling = types.FunctionCallingConfig(
            mode=types.FunctionCallingConfigMode(mode), allowed_function_names=allowed
        )
        config = types.GenerateContentConfig(
            tools=tools,
            temperature=0,
            max_output_tokens=100 if turn < 2 else 8,
            tool_config=types.ToolConfig(function_calling_config=calling),
        )
        if turn == 1:  # the middle turn streams: capture and linking must not care
            chunks = list(client.models.generate_content_stream(model=model, contents=contents, config=config))
            reply, parts = chunks[-1], [p for c in chunks for p in (c.candidates or [])[0].content.parts or []]  # type: ignore[union-attr]
            headers = chunks[0].sdk_http_response.headers  # type: ignore[union-attr]
            contents.extend(c.candidates[0].content for c in chunks if c.candidates and c.candidates[0].content)
        else:
            reply = client.models.generate_content(model=model, contents=contents, config=config)
            parts = reply.candidates[0].content.parts or []  # type: ignore[index,union-attr]
            headers = reply.sdk_http_response.headers  # type: ignore[union-attr]
            contents.append(reply.candidates[0].content)  # type: ignore[index,arg-type]
        assert headers is not None
        ids.append(headers["x-request-id"])
        sessions.add(headers["x-session-id"])
        calls = [p.function_call for p in parts if p.function_call]
        if turn == 2:
            assert not calls
            break
        [call] = calls
        assert call.name == "calculator" and call.args == {"expression": "17*3"} and call.id
        result = f"RESULT-{turn}: 51"
        results.append(result)
        answer = types.Part.from_function_response(name="calculator", response={"result": result})
        contents.append(types.Content(role="user", parts=[answer]))
    assert len(sessions) == 1, "the Gemini history must link the three calls into one session"

    proxy.wait_drained()
    first = record(proxy, key, ids[0])
    assert first["request"]["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert [t["function"]["name"] for t in first["request"]["tools"]] == ["calculator"]  # googleSearch left out
    assert record(proxy, key, ids[1])["request"]["tool_choice"] == "required"
    third = record(proxy, key, ids[2])
    assert third["request"]["tool_choice"] == "none"
    tool_messages = [m for m in third["request"]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [
        m["tool_calls"][0]["id"] for m in third["request"]["messages"] if m.get("tool_calls")
    ]
    rendered = httpx.post(
        f"{engine.url}/v1/chat/completions/render", json={**third["request"], "model": model}, timeout=60
    )
    assert rendered.status_code == 200, rendered.text
    assert third["prompt_token_ids"] == rendered.json()["token_ids"]
    got = httpx.get(f"{proxy.v1}/sessions/{sessions.pop()}/trajectories", headers={"x-api-key": key}, timeout=30)
    [traj] = got.json()["data"]
    assert traj["completion_ids"] == ids
    sampled = [t for completion_id in ids for t in record(proxy, key, completion_id)["completion_token_ids"][0]]
    assert [t for t, m in zip(traj["token_ids"], traj["mask"], strict=True) if m] == sampled
