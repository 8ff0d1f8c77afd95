"""The Gemini dialect's translation (pure functions) and its routes' refusals in front of the stub engine.

Bad input never reaches an engine, so the stub stands in for one in the route tests: each
refusal is a 400 in Google's error shape naming the field, through the unmodified google-genai
SDK too, and nothing is recorded as a success.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest
from google import genai
from google.genai import errors, types

from proxy.dialects.base import Exchange, StreamEnd
from proxy.dialects.gemini import GeminiDialect, call_route, count_tokens_body, dumps, to_chat
from proxy.dialects.gemini_out import from_chat
from proxy.errors import InvalidRequest
from tests.proxy.conftest import ProxyFactory, make_key

USER = {"role": "user", "parts": [{"text": "What is 17 times 3?"}]}
CALC = {
    "name": "calc",
    "description": "Evaluate",
    "parameters": {
        "type": "OBJECT",
        "required": ["e"],
        "propertyOrdering": ["e", "n"],
        "properties": {"e": {"type": "STRING", "example": "1+1"}, "n": {"type": "INTEGER", "nullable": True}},
    },
}


def test_paths_name_the_model_mode_session_and_key() -> None:
    found = call_route("/v1beta/models/tiny:streamGenerateContent", b"alt=sse&key=k1")
    assert found is not None
    endpoint, session, dialect = found
    assert (endpoint, session) == ("chat", None) and isinstance(dialect, GeminiDialect)
    assert dialect.stream_requested({}) is True and dialect.credentials({}) == "Bearer k1"
    assert dialect.credentials({"x-goog-api-key": "k2"}) == "Bearer k2"
    assert dialect.to_chat({"contents": [USER]}, None)["model"] == "tiny"
    found = call_route("/s/ticket-9/v1/models/tiny:generateContent", b"")  # the SDK's own version
    assert found is not None and found[1] == "ticket-9" and found[2].stream_requested({"stream": True}) is False
    assert call_route("/v1beta/models/tiny:countTokens", b"") is None  # served by its FastAPI route
    assert call_route("/v1beta/models/:generateContent", b"") is None
    assert call_route("/v1/chat/completions", b"") is None
    unstreamed = call_route("/v1beta/models/tiny:streamGenerateContent", b"")
    assert unstreamed is not None
    with pytest.raises(InvalidRequest) as info:
        unstreamed[2].stream_requested({})
    assert info.value.param == "alt"


def test_system_turns_and_generation_config() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "Be "}, {"text": "terse."}]},
        "contents": [
            USER,
            {"role": "model", "parts": [{"text": "It is "}]},
            {"role": "model", "parts": [{"text": "51", "thoughtSignature": "c2ln"}]},
            {"parts": [{"text": "Sure?"}, {"text": " Say."}]},
        ],
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        "generationConfig": {
            "temperature": 0.5,
            "topP": 0.9,
            "topK": 0,
            "maxOutputTokens": 16.0,
            "seed": 7,
            "stopSequences": ["\n\n"],
            "candidateCount": 1,
            "responseMimeType": "text/plain",
            "thinkingConfig": {"thinkingBudget": 0},
        },
    }
    chat = to_chat(body, "m")
    assert chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 17 times 3?"},
        {"role": "assistant", "content": "It is 51"},  # a streamed history: one content per chunk, one turn
        {"role": "user", "content": "Sure? Say."},
    ]
    assert {k: chat[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")} == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 16,
        "seed": 7,
        "stop": ["\n\n"],
    }
    assert "stream" not in chat and "tools" not in chat
    prefill = to_chat({"contents": [USER, {"role": "model", "parts": [{"text": "It is"}]}]}, "m")
    assert prefill["continue_final_message"] is True and prefill["add_generation_prompt"] is False
    schema = {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}}
    structured = to_chat(
        {"contents": [USER], "generationConfig": {"responseMimeType": "application/json", "responseSchema": schema}},
        "m",
    )
    assert structured["response_format"]["json_schema"]["schema"] == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }


def test_function_declarations_calls_and_responses() -> None:
    calls = [
        {"functionCall": {"name": "calc", "args": {"e": "1+1"}}},
        {"functionCall": {"id": "call_b", "name": "calc", "args": {"e": "2+2"}}},
    ]
    answers = [
        {"functionResponse": {"id": "call_b", "name": "calc", "response": {"result": 4}}},
        {"functionResponse": {"name": "calc", "response": {"result": 2}}},
        {"text": "Both?"},
    ]
    body = {
        "contents": [USER, {"role": "model", "parts": calls}, {"role": "user", "parts": answers}],
        "tools": [{"functionDeclarations": [CALC]}, {"googleSearch": {}}, {"codeExecution": {}}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["calc"]}},
    }
    chat = to_chat(body, "m")
    assistant, first, second, user = chat["messages"][1:]
    assert assistant["content"] is None
    assert [(c["id"], c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        ("call_1_0", '{"e": "1+1"}'),
        ("call_b", '{"e": "2+2"}'),
    ]
    # By id when the response has one, else the first unanswered call of that name.
    assert (first["tool_call_id"], json.loads(first["content"])) == ("call_b", {"result": 4})
    assert (second["tool_call_id"], json.loads(second["content"])) == ("call_1_0", {"result": 2})
    assert user == {"role": "user", "content": "Both?"}
    [tool] = chat["tools"]  # the hosted tools are left out of what the engine sees
    assert tool["function"]["strict"] is True  # ANY keeps calls to the schema
    assert tool["function"]["parameters"] == {
        "type": "object",
        "required": ["e"],
        "properties": {"e": {"type": "string"}, "n": {"type": ["integer", "null"]}},
    }
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "calc"}}
    for mode, choice in (("AUTO", "auto"), ("NONE", "none"), ("ANY", "required"), ("VALIDATED", "auto")):
        config = {"functionCallingConfig": {"mode": mode}}
        assert to_chat({**body, "toolConfig": config}, "m")["tool_choice"] == choice
    counted = count_tokens_body({"generateContentRequest": {**body, "model": "models/m"}}, "m")
    assert counted["messages"] == chat["messages"] and counted["add_generation_prompt"] is True


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("contents", {"contents": []}),
        ("contents[0].role", {"contents": [{"role": "system", "parts": [{"text": "x"}]}]}),
        ("contents[0].parts[0].inlineData", {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png"}}]}]}),
        ("contents[0].parts[0].functionCall", {"contents": [{"parts": [{"functionCall": {"name": "calc"}}]}]}),
        (
            "contents[1].parts[0].functionResponse.name",
            {"contents": [USER, {"parts": [{"functionResponse": {"name": "calc", "response": {}}}]}]},
        ),
        (
            "contents[2].parts[0].functionResponse.id",
            {
                "contents": [
                    USER,
                    {"role": "model", "parts": [{"functionCall": {"id": "a", "name": "other"}}]},
                    {"parts": [{"functionResponse": {"id": "b", "name": "calc", "response": {}}}]},
                ]
            },
        ),
        ("generationConfig.candidateCount", {"contents": [USER], "generationConfig": {"candidateCount": 2}}),
        ("generationConfig.temperature", {"contents": [USER], "generationConfig": {"temperature": "hot"}}),
        ("generationConfig.maxOutputTokens", {"contents": [USER], "generationConfig": {"maxOutputTokens": 0}}),
        (
            "generationConfig.responseModalities",
            {"contents": [USER], "generationConfig": {"responseModalities": ["IMAGE"]}},
        ),
        ("tools[0].functionDeclarations[0].name", {"contents": [USER], "tools": [{"functionDeclarations": [{}]}]}),
        (
            "tools[0].functionDeclarations[0].parameters.properties.e.type",
            {
                "contents": [USER],
                "tools": [
                    {
                        "functionDeclarations": [
                            {"name": "f", "parameters": {"type": "OBJECT", "properties": {"e": {"type": "TEXT"}}}}
                        ]
                    }
                ],
            },
        ),
        (
            "toolConfig.functionCallingConfig.allowedFunctionNames",
            {
                "contents": [USER],
                "tools": [{"functionDeclarations": [CALC]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["nope"]}},
            },
        ),
        ("cachedContent", {"contents": [USER], "cachedContent": "cachedContents/abc"}),
    ],
)
def test_bad_input_names_the_field(field: str, body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as info:
        to_chat(body, "m")
    assert info.value.param == field and info.value.message.startswith(field + ":")


def test_arguments_are_written_as_json_dumps_writes_them() -> None:
    values: list[Any] = [
        {"e": "17*3", "n": [1, 2.5, 1e16, None, True], "nested": {"é": 'x\n"\u2028\x01'}},
        {},
        [],
        "s",
        {"path": "src/a.py", "limit": 200, "all": False, "since": None},
        {"a": {"b": [{}, [], [[1e-07, 0.00001, -0.0, 1.0]], {"c": {"d": "x: 1.5, y"}}]}},  # floats orjson writes apart
        {"big": 2**64, "small": -(2**63) - 1, "max": 2**64 - 1},  # orjson refuses 2**64: json.dumps writes it
        {"t": (1, 2.5)},  # not what JSON parses to (a tuple): as json.dumps writes it all the same
        {1: "one"},  # keys are strings in JSON; an integer as json.dumps names it
        1.5,
        -(2**70),
    ]
    for value in values:
        assert dumps(value) == json.dumps(value, ensure_ascii=False), value
    deep: Any = "x"  # 600 levels: the value-by-value writer ran out of stack at about 330
    for _ in range(300):
        deep = {"k": [deep]}
    assert dumps(deep) == json.dumps(deep, ensure_ascii=False)


def test_a_later_content_is_named_before_a_bad_part_of_an_earlier_one() -> None:
    """Every content's shape is checked before any part is refused; then parts in order."""
    bad_part = {"parts": [{"inlineData": {"mimeType": "image/png"}}]}
    for contents, field in (
        ([bad_part, USER, {"role": "system", "parts": [{"text": "x"}]}], "contents[2].role"),
        ([bad_part, {"role": "user", "parts": "x"}], "contents[1].parts"),
        ([USER, {"role": "model", "parts": [{"text": 3}]}, "content"], "contents[2]"),
        ([bad_part, USER, {"role": "model", "parts": [{"text": 3}]}], "contents[0].parts[0].inlineData"),
        (
            [USER, {"role": "model", "parts": [{"functionCall": {"name": "f", "args": []}}]}],
            "contents[1].parts[0].functionCall.args",
        ),
    ):
        with pytest.raises(InvalidRequest) as info:
            to_chat({"contents": contents}, "m")
        assert info.value.param == field, (contents, info.value.param)


def test_contents_of_one_role_are_one_turn_and_answer_the_previous_turns_calls() -> None:
    call = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"x": 1}}}]}
    again = {"role": "model", "parts": [{"text": "and "}, {"functionCall": {"name": "f", "id": "c2", "args": {}}}]}
    answers = [
        {"role": "user", "parts": [{"functionResponse": {"id": "c2", "name": "f", "response": {"r": 2}}}]},
        {"parts": [{"functionResponse": {"name": "f", "response": {"r": 1}}}, {"text": "ok?"}]},
        {"role": "function", "parts": []},
    ]
    chat = to_chat({"contents": [USER, call, again, *answers]}, "m")
    assert chat["messages"] == [
        {"role": "user", "content": "What is 17 times 3?"},
        {
            "role": "assistant",
            "content": "and ",
            "tool_calls": [
                {"id": "call_1_0", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": '{"r": 2}'},
        {"role": "tool", "tool_call_id": "call_1_0", "content": '{"r": 1}'},
        {"role": "user", "content": "ok?"},
    ]
    twice = {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}] * 3}
    with pytest.raises(InvalidRequest) as info:
        to_chat({"contents": [USER, call, again, twice]}, "m")
    assert info.value.param == "contents[3].parts[2].functionResponse.name"


def test_a_stream_adds_up_to_the_reply() -> None:
    dialect = GeminiDialect("m", True, alt="sse")
    ex = Exchange("gemini-1", "m", 0, {}, {})
    head = {"id": "c", "object": "chat.completion.chunk"}
    start = {"index": 0, "delta": {"role": "assistant"}}
    chunks: list[dict[str, Any]] = [
        {**head, "prompt_token_ids": [1, 2, 3], "choices": [start]},
        {**head, "choices": [{"index": 0, "delta": {"content": "Hi "}, "token_ids": [5]}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "there"}, "token_ids": [6]}]},
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "t1", "function": {"name": "calc", "arguments": '{"e": '}}]
                    },
                    "token_ids": [7],
                }
            ],
        },
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"1"}'}}]},
                    "token_ids": [8],
                    "finish_reason": "tool_calls",
                }
            ],
        },
    ]
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    events = dialect.stream(ex)
    sent = [events.feed(c) for c in chunks] + [events.close(StreamEnd("tool_calls", usage))]
    assert [len(s.split(b"\n\n")) - 1 for s in sent] == [0, 1, 1, 0, 1, 1]  # text at once, a call whole
    bodies = [orjson.loads(s[6:].split(b"\n\n")[0]) for s in sent if s]
    assert [b["candidates"][0]["content"]["parts"] for b in bodies[:3]] == [
        [{"text": "Hi "}],
        [{"text": "there"}],
        [{"functionCall": {"name": "calc", "args": {"e": "1"}, "id": "t1"}}],
    ]
    assert bodies[-1]["candidates"][0]["finishReason"] == "STOP"
    assert bodies[-1]["usageMetadata"] == {"promptTokenCount": 3, "candidatesTokenCount": 4, "totalTokenCount": 7}
    message = {
        "role": "assistant",
        "content": "Hi there",
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "1"}'}}],
    }
    reply = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": usage}
    assert events.result == from_chat(reply, "gemini-1", "m")
    failed = dialect.stream(ex)
    failed.feed(chunks[1])
    tail = orjson.loads(failed.close(StreamEnd("timeout", None, "the engine went silent"))[6:])
    assert tail["error"]["status"] == "DEADLINE_EXCEEDED" and failed.result is not None


def test_bad_input_gets_google_errors_and_nothing_is_recorded_as_success(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    proxy, key = start_proxy(stub_upstream, db_url, auth=True), make_key(db_url)
    client = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=proxy.url))
    url = f"{proxy.url}/v1beta/models/stub-model:generateContent"
    cases = {
        "contents[0].parts[0].inlineData": {
            "contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]
        },
        "generationConfig.candidateCount": {"contents": [USER], "generationConfig": {"candidateCount": 2}},
        "contents": {"contents": []},
        "metadata.session_id": {"contents": [USER], "metadata": {"session_id": "s" * 201}},  # proxy.admission's
    }
    for field, request in cases.items():
        got = httpx.post(url, json=request, headers={"x-goog-api-key": key}, timeout=10)
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
        assert error["message"].startswith(field), error
        assert error["details"][0]["fieldViolations"][0]["field"] == field
    with pytest.raises(errors.ClientError) as info:
        client.models.generate_content(
            model="stub-model", contents="hi", config=types.GenerateContentConfig(candidate_count=2)
        )
    assert info.value.code == 400 and info.value.status == "INVALID_ARGUMENT"
    assert (info.value.message or "").startswith("generationConfig.candidateCount:")
    no_alt = httpx.post(
        url.replace(":generateContent", ":streamGenerateContent"),
        json={"contents": [USER]},
        headers={"x-goog-api-key": key},
        timeout=10,
    )
    assert no_alt.status_code == 400 and no_alt.json()["error"]["details"][0]["fieldViolations"][0]["field"] == "alt"
    unauthorised = httpx.post(url, json={"contents": [USER]}, timeout=10)
    assert unauthorised.status_code == 401 and unauthorised.json()["error"]["status"] == "UNAUTHENTICATED"
    unknown = httpx.post(url.replace("stub-model", "nope"), json={"contents": [USER]}, params={"key": key}, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    counted = httpx.post(
        url.replace(":generateContent", ":countTokens"), json={"contents": []}, params={"key": key}, timeout=10
    )
    assert counted.status_code == 400 and counted.json()["error"]["message"].startswith("contents:")
    # ?key= authenticates as x-goog-api-key does; the call is recorded as a gemini call.
    ok = httpx.post(
        url, json={"contents": [USER], "generationConfig": {"maxOutputTokens": 4}}, params={"key": key}, timeout=10
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["responseId"] == ok.headers["x-request-id"]
    proxy.wait_drained()
    listed = httpx.get(f"{proxy.v1}/chat/completions", headers={"x-api-key": key}, timeout=10).json()["data"]
    assert [r["id"] for r in listed if r["onthejob"]["status_code"] == 200] == [ok.json()["responseId"]]
    assert listed[-1]["onthejob"]["dialect"] == "gemini"


def test_models_list_and_get_through_the_sdk_and_googles_shape_off_the_routes(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    """``models.list``/``models.get`` answer the aliases this key may use; a path or method under
    ``/v1beta/`` we do not serve answers 404/405 in Google's error shape, not OpenAI's."""
    db_url = pg_factory()
    proxy, key = start_proxy(stub_upstream, db_url, auth=True), make_key(db_url)
    client = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=proxy.url))
    listed = [m.name for m in client.models.list()]
    assert "models/stub-model" in listed, listed
    one = client.models.get(model="stub-model")
    assert one.name == "models/stub-model" and "generateContent" in (one.supported_actions or [])
    with pytest.raises(errors.ClientError) as info:
        client.models.get(model="no-such-model")
    assert info.value.code == 404 and info.value.status == "NOT_FOUND"
    paged = httpx.get(f"{proxy.url}/v1beta/models", params={"key": key, "pageSize": 1}, timeout=10).json()
    assert len(paged["models"]) == 1
    unauthorised = httpx.get(f"{proxy.url}/v1beta/models", timeout=10)
    assert unauthorised.status_code == 401 and unauthorised.json()["error"]["status"] == "UNAUTHENTICATED"
    for method, path, status in [
        ("POST", "/v1beta/models/stub-model:embedContent", 404),
        ("GET", "/v1beta/cachedContents", 404),
        ("GET", "/v1beta/models/stub-model:generateContent", 405),
    ]:
        got = httpx.request(method, f"{proxy.url}{path}", params={"key": key}, timeout=10)
        assert got.status_code == status, (path, got.text)
        error = got.json()["error"]
        assert error["code"] == status and error["status"] in ("NOT_FOUND", "UNIMPLEMENTED", "INVALID_ARGUMENT"), error
    assert httpx.get(f"{proxy.v1}/models", headers={"x-api-key": key}, timeout=10).json()["object"] == "list"
