"""The Anthropic Messages API through the proxy to the real SmolLM2, checked against the engine's own /v1/messages.

The unmodified anthropic SDK (and curl) talk to the proxy with an ``x-api-key``; every
reply is compared with what vLLM's own ``/v1/messages`` answers to the same greedy
request, parsed by the SDK's types field by field, and read back from the records with
its token ids. A forced tool call → tool_result → answer conversation must become one
trajectory whose sampled tokens are exactly the engine's.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message
from transformers import AutoTokenizer

from engine.launcher import Engine
from tests.proxy.conftest import Proxy, ProxyFactory, make_key

pytestmark = [pytest.mark.engine, pytest.mark.default_model]

CALC = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression",
    "strict": True,
    "input_schema": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
}
# What Claude Code sends besides the request proper: all accepted, none changes the answer.
EXTRAS: dict[str, Any] = {
    "metadata": {"user_id": "user_4711"},
    "service_tier": "auto",
    "thinking": {"type": "disabled"},
    "extra_headers": {"anthropic-beta": "prompt-caching-2024-07-31,claude-code-20250219"},
    "extra_query": {"beta": "true"},
}
GREEDY = {"extra_body": {"temperature": 0}}  # this SDK has no temperature argument; the API still takes one


@pytest.fixture
def served(start_proxy: ProxyFactory, default_engine: Engine, pg_factory: Any) -> tuple[Proxy, str, Engine]:
    db_url = pg_factory()
    return start_proxy(default_engine.url, db_url, auth=True), make_key(db_url), default_engine


def engine_messages(engine: Engine, request: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own /v1/messages for the same greedy request: the reference."""
    reply = httpx.post(f"{engine.url}/v1/messages", json={**request, "temperature": 0}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def record(proxy: Proxy, key: str, completion_id: str) -> dict[str, Any]:
    got = httpx.get(f"{proxy.v1}/chat/completions/{completion_id}", headers={"x-api-key": key}, timeout=10)
    assert got.status_code == 200, got.text
    return got.json()["onthejob"]  # type: ignore[no-any-return]


def assert_every_sdk_field(raw: dict[str, Any]) -> None:
    """Each field the SDK's Message and Usage define is present, and the whole validates (types checked)."""
    Message.model_validate(raw)
    for name, info in Message.model_fields.items():
        assert (info.alias or name) in raw, f"Message.{name} missing"
    for name in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        assert isinstance(raw["usage"][name], int), name


def same_reply(ours: dict[str, Any], reference: dict[str, Any]) -> None:
    def blocks(message: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(b["type"], b.get("text"), b.get("name"), b.get("input")) for b in message["content"]]

    assert blocks(ours) == blocks(reference)
    assert (ours["stop_reason"], ours.get("stop_sequence")) == (
        reference["stop_reason"],
        reference.get("stop_sequence"),
    )
    assert ours["usage"]["input_tokens"] == reference["usage"]["input_tokens"]
    assert ours["usage"]["output_tokens"] == reference["usage"]["output_tokens"]


def test_sdk_create_stream_count_tokens_and_curl_match_the_engine(served: tuple[Proxy, str, Engine]) -> None:
    proxy, key, engine = served
    client = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)  # ANTHROPIC_BASE_URL=proxy.url
    model = engine.model.name
    system = [{"type": "text", "text": "You are a terse assistant.", "cache_control": {"type": "ephemeral"}}]
    messages: list[Any] = [{"role": "user", "content": "Name three colours."}]
    request = {"model": model, "max_tokens": 24, "system": system, "messages": messages, "stop_sequences": ["\n\n\n"]}

    raw = client.messages.with_raw_response.create(**request, **EXTRAS, **GREEDY)  # type: ignore[arg-type]
    message = raw.parse()
    body = raw.http_response.json()
    assert message.id == raw.headers["x-request-id"]
    assert_every_sdk_field(body)
    reference = engine_messages(engine, request)
    same_reply(body, reference)

    with client.messages.stream(**request, **EXTRAS, **GREEDY) as stream:  # type: ignore[arg-type]
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "content_block_delta" in events
    assert final.model_dump(exclude={"id"}) == message.model_dump(exclude={"id"})

    counted = client.messages.count_tokens(model=model, system=system, messages=messages)  # type: ignore[arg-type]
    assert counted.input_tokens == message.usage.input_tokens

    curl = subprocess.run(
        [
            "curl",
            "-sN",
            f"{proxy.url}/v1/messages",
            "-H",
            f"x-api-key: {key}",
            "-H",
            "anthropic-version: 2023-06-01",
            "-H",
            "content-type: application/json",
            "-d",
            json.dumps({**request, "temperature": 0, "stream": True}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    frames = [f for f in curl.stdout.split("\n\n") if f.strip()]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    curl_id = json.loads(frames[0].split("\n")[1].removeprefix("data: "))["message"]["id"]

    proxy.wait_drained()
    for completion_id, streamed in ((message.id, False), (final.id, True), (curl_id, True)):
        rec = record(proxy, key, completion_id)
        assert rec["dialect"] == "anthropic" and rec["stream"] is streamed
        assert len(rec["prompt_token_ids"]) == message.usage.input_tokens
        assert len(rec["completion_token_ids"][0]) == message.usage.output_tokens
        assert len(rec["logprobs"][0]) == message.usage.output_tokens
        assert rec["client_request"]["messages"] == messages and rec["request"]["messages"][0]["role"] == "system"
        if completion_id != curl_id:  # the SDK calls sent metadata.user_id: kept as the end user
            assert rec["request"]["user"] == "user_4711"
    assert record(proxy, key, message.id)["client_response"] == body


def test_forced_tool_use_round_trip_is_one_token_exact_trajectory(served: tuple[Proxy, str, Engine]) -> None:
    proxy, key, engine = served
    client = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)
    model = engine.model.name
    messages: list[Any] = [{"role": "user", "content": "What is 17 times 3? Use the calculator."}]
    choices: list[dict[str, Any]] = [{"type": "tool", "name": "calculator"}, {"type": "any"}, {"type": "none"}]
    ids, sessions, results = [], set(), []
    for turn, choice in enumerate(choices):
        request = {
            "model": model,
            "max_tokens": 100 if turn < 2 else 16,
            "messages": messages,
            "tools": [CALC],
            "tool_choice": choice,
        }
        if turn == 1:  # the middle turn streams: capture and linking must not care
            with client.messages.stream(**request, **GREEDY) as stream:  # type: ignore[arg-type]
                message = stream.get_final_message()
                headers = stream.response.headers
        else:
            raw = client.messages.with_raw_response.create(**request, **GREEDY)  # type: ignore[arg-type]
            message, headers = raw.parse(), raw.headers
        if turn == 0:
            same_reply(message.model_dump(), engine_messages(engine, request))
        ids.append(message.id)
        sessions.add(headers["x-session-id"])
        if turn == 2:
            assert message.content[0].type == "text"
            break
        assert message.stop_reason == "tool_use"
        use = next(b for b in message.content if b.type == "tool_use")
        assert use.name == "calculator" and isinstance(use.input, dict)
        result = f"RESULT-{turn}: 51"
        results.append(result)
        reply = {"type": "tool_result", "tool_use_id": use.id, "content": result}
        messages = [
            *messages,
            {"role": "assistant", "content": message.content},  # type: ignore[list-item]
            {"role": "user", "content": [reply]},
        ]
    assert len(sessions) == 1, "the Messages history must link the three calls into one session"

    proxy.wait_drained()
    got = httpx.get(f"{proxy.v1}/sessions/{sessions.pop()}/trajectories", headers={"x-api-key": key}, timeout=30)
    [traj] = got.json()["data"]
    assert traj["completion_ids"] == ids
    sampled, sampled_lp = [], []
    for completion_id in ids:
        rec = record(proxy, key, completion_id)
        sampled += rec["completion_token_ids"][0]
        sampled_lp += rec["logprobs"][0]
    tokens, mask, lps = traj["token_ids"], traj["mask"], traj["logprobs"]
    assert [t for t, m in zip(tokens, mask, strict=True) if m] == sampled
    assert [lp for lp, m in zip(lps, mask, strict=True) if m] == sampled_lp
    unmasked = AutoTokenizer.from_pretrained(engine.model.path).decode(
        [t for t, m in zip(tokens, mask, strict=True) if not m]
    )
    for result in results:
        assert result in unmasked  # tool_result content is context (mask 0), as the engine saw it
