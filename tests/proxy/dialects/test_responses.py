"""The Responses dialect's translation, as pure functions: requests to chat, replies and streams back.

The SDK's own types are the judge of the shapes we send: every field ``Response``
defines is present, and every event parses as the SDK's ``ResponseStreamEvent``.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.dialects.base import Exchange, Stored, StreamEnd
from proxy.dialects.responses import ResponsesDialect
from proxy.errors import InvalidRequest
from proxy.link_keys import link_key, prefix_keys

D = ResponsesDialect()
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CAPTURE_KEYS = {"token_ids", "prompt_token_ids", "prompt_text", "stop_reason", "system_fingerprint"}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def ex(request: dict[str, Any], chat: dict[str, Any] | None = None) -> Exchange:
    return Exchange(id="resp_" + "0" * 32, model="alias", created=1700000000, request=request, chat=chat or {})


def chat_reply(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    """A chat reply as the engine sends it to the proxy (capture fields on)."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "served",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "token_ids": [7, 8],
                "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def keys_in(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in keys_in(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in keys_in(v)}
    return set()


def assert_full_response(body: dict[str, Any]) -> Response:
    """Every field of the SDK's Response is present (aliases as on the wire), and the body parses."""
    expected = {f.alias or name for name, f in Response.model_fields.items()}
    assert expected <= set(body), f"missing: {expected - set(body)}"
    assert not keys_in(body) & CAPTURE_KEYS
    return Response.model_validate(body)


# ---------------------------------------------------------------- requests


def test_string_input_instructions_and_sampling() -> None:
    chat = D.to_chat(
        {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "max_output_tokens": 9,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "store": True,
            "include": ["reasoning.encrypted_content"],
            "truncation": "auto",
            "metadata": {"session_id": "s"},
            "reasoning": {"effort": "low"},
            "user": "u",
            "service_tier": "auto",
        },
        None,
    )
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 9,
        "temperature": 0,
        "top_p": 0.5,
        "seed": 3,
        "stream": False,
    }


def test_items_tools_and_forced_choice() -> None:
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "?"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        "stream": True,
    }
    chat = D.to_chat(body, None)
    assert chat["messages"] == [
        {"role": "user", "content": "weather \n?"},  # parts joined as vLLM joins them
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert chat["stream"] is True
    assert (
        D.to_chat({"model": "m", "input": "x", "tools": [WEATHER], "tool_choice": "required"}, None)["tool_choice"]
        == "required"
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"input": []}, "input"),
        ({"input": None}, "input"),
        ({"tools": [{"type": "function", "parameters": {"type": "object"}}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]}, "tools[0].parameters"),
        ({"tools": [{"type": "function", "name": "f", "parameters": "nope"}]}, "tools[0].parameters"),
        ({"tools": [{"type": "frobnicate"}]}, "tools[0].type"),  # no SDK knows it: the engine refuses it too
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "allowed_tools"}, "tools": [WEATHER]}, "tool_choice"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"instructions": ["x"]}, "instructions"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"stream": "yes"}, "stream"),
        ({"model": None}, "model"),
    ],
)
def test_bad_input_names_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        D.to_chat({"model": "m", "input": "x", **body}, None)
    assert err.value.param == param
    status, envelope = D.error(err.value)
    assert (
        status == 400 and envelope["error"]["param"] == param and envelope["error"]["type"] == "invalid_request_error"
    )


# ---------------------------------------------------------------- continuation


def _previous(request: dict[str, Any], chat: dict[str, Any], reply: dict[str, Any], **kw: Any) -> Stored:
    client = D.reply(copy.deepcopy(reply), ex(request, chat))
    message = reply["choices"][0]["message"]
    return Stored(
        id="resp_prev",
        project_id="p",
        session_id="s",
        task_id=None,
        dialect="responses",
        status_code=kw.get("status", 200),
        request=chat,
        choices=[{"index": 0, "message": message}],
        client_request=request,
        client_response=client,
    )


def test_previous_response_id_equals_resending_the_whole_input() -> None:
    """Both ways of continuing give the same chat messages, so the same link keys and one trajectory."""
    first = {
        "model": "m",
        "instructions": "sys",
        "input": "weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    chat1 = D.to_chat(first, None)
    call = {
        "id": "chatcmpl-tool-1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"P"}'},
    }
    reply = chat_reply({"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls")
    prev = _previous(first, chat1, reply)
    follow = [{"type": "function_call_output", "call_id": "chatcmpl-tool-1", "output": "sunny"}]
    by_id = D.to_chat({"model": "m", "instructions": "sys", "input": follow, "previous_response_id": "resp_prev"}, prev)
    assert prev.client_response is not None
    whole = [{"role": "user", "content": "weather in Paris?"}, *prev.client_response["output"], *follow]
    resent = D.to_chat({"model": "m", "instructions": "sys", "input": whole}, None)
    assert by_id["messages"] == resent["messages"]
    # The previous call's link key (its messages plus the reply it got) is a prefix key of the follow-up.
    parent_key = link_key(prefix_keys(chat1["messages"])[-1], reply["choices"][0]["message"])
    assert parent_key in prefix_keys(by_id["messages"])


def test_previous_without_instructions_drops_the_old_system_message() -> None:
    first = {"model": "m", "instructions": "old", "input": "hi"}
    chat1 = D.to_chat(first, None)
    prev = _previous(first, chat1, chat_reply({"role": "assistant", "content": "hello"}))
    chat = D.to_chat({"model": "m", "input": "again", "previous_response_id": "resp_prev"}, prev)
    assert chat["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]


def test_previous_that_cannot_be_continued() -> None:
    first = {"model": "m", "input": "hi", "store": False}
    prev = _previous(first, D.to_chat(first, None), chat_reply({"role": "assistant", "content": "x"}))
    with pytest.raises(InvalidRequest) as err:
        D.to_chat({"model": "m", "input": "y", "previous_response_id": "resp_prev"}, prev)
    assert err.value.param == "previous_response_id"
    with pytest.raises(InvalidRequest):
        D.previous_id({"previous_response_id": 5})


# ---------------------------------------------------------------- replies


def test_text_reply_is_a_full_response_without_capture_fields() -> None:
    request = {"model": "alias", "input": "hi", "metadata": {"k": "v"}}
    body = D.reply(chat_reply({"role": "assistant", "content": "hello"}), ex(request))
    parsed = assert_full_response(body)
    assert parsed.output_text == "hello" and parsed.status == "completed" and parsed.id == "resp_" + "0" * 32
    assert body["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }
    assert body["output"][0]["content"][0]["logprobs"] == []  # not asked for
    assert body["metadata"] == {"k": "v"} and body["model"] == "alias"


def test_tool_call_reply_and_length_and_logprobs() -> None:
    call = {"id": "chatcmpl-tool-9", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    body = D.reply(chat_reply({"role": "assistant", "content": "", "tool_calls": [call]}), ex({"tools": [WEATHER]}))
    assert_full_response(body)
    assert [i["type"] for i in body["output"]] == ["function_call"]
    assert body["output"][0]["call_id"] == "chatcmpl-tool-9" and body["tools"][0]["name"] == "get_weather"
    cut = D.reply(
        chat_reply({"role": "assistant", "content": "abc"}, "length"), ex({"include": ["message.output_text.logprobs"]})
    )
    parsed = assert_full_response(cut)
    assert parsed.status == "incomplete" and parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"
    assert cut["output"][0]["content"][0]["logprobs"] == [
        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}
    ]


# ---------------------------------------------------------------- streams


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "token_ids": [5], "logprobs": {"content": []}}]
    )
    out: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "choices": choices, "prompt_token_ids": [1]}
    if usage:
        out["usage"] = usage
    return out


def events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            body = orjson.loads(data.removeprefix("data: "))
            assert name == "event: " + body["type"]
            EVENTS.validate_python(body)  # the SDK's own event union
            out.append(body)
    return out


USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def run_stream(
    chunks: list[dict[str, Any]], end: StreamEnd, request: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], Any]:
    s = D.stream(ex(request or {}))
    raw = s.open() + b"".join(s.feed(c) for c in chunks) + s.close(end)
    evs = events(raw)
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    return evs, s.result


def test_text_stream_event_sequence() -> None:
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({"content": "!"}, "stop"),
        chunk(None, usage=USAGE),
    ]
    evs, result = run_stream(chunks, StreamEnd("stop", USAGE))
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
    assert evs[7]["text"] == "Hello!"
    final = assert_full_response(evs[-1]["response"])
    assert final.output_text == "Hello!" and final.usage is not None and final.usage.output_tokens == 4
    assert result == evs[-1]["response"]
    # The stream adds up to what the non-streamed reply says (ids and times aside).
    whole = D.reply(chat_reply({"role": "assistant", "content": "Hello!"}) | {"usage": USAGE}, ex({}))
    assert _strip_ids(whole) == _strip_ids(result)


def _strip_ids(body: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body.pop("completed_at")
    for item in body["output"]:
        item.pop("id")
    return body


def test_tool_call_stream_after_text_and_two_calls() -> None:
    chunks = [
        chunk({"content": "Checking."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    evs, result = run_stream(chunks, StreamEnd("tool_calls", USAGE), {"tools": [WEATHER]})
    kinds = [e["type"] for e in evs]
    assert kinds[-10:-1] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [(i["type"], i.get("call_id"), i.get("arguments")) for i in result["output"]] == [
        ("message", None, None),
        ("function_call", "call_a", '{"city": "Paris"}'),
        ("function_call", "call_b", "{}"),
    ]
    assert [i["status"] for i in result["output"]] == ["completed"] * 3
    assert [e["output_index"] for e in evs if e["type"] == "response.output_item.added"] == [0, 1, 2]
    assert evs[-1]["type"] == "response.completed"


def test_stream_cut_by_length_and_by_a_broken_engine() -> None:
    evs, result = run_stream([chunk({"content": "ab"}, "length")], StreamEnd("length", USAGE))
    assert evs[-1]["type"] == "response.incomplete" and result["incomplete_details"] == {"reason": "max_output_tokens"}
    assert result["output"][0]["status"] == "incomplete"
    evs, result = run_stream([chunk({"content": "ab"})], StreamEnd("upstream_error", None, "stream broke"))
    assert evs[-1]["type"] == "response.failed" and result["status"] == "failed"
    assert result["error"]["message"] == "stream broke" and result["output"][0]["status"] == "incomplete"
    assert_full_response(result)


def test_stream_failure_event_parses_in_the_sdk() -> None:
    from proxy.errors import Unavailable

    s = D.stream(ex({}))
    s.open()
    (event,) = events(s.fail(Unavailable("the recording spool is full", code="spool_full")))
    assert event["type"] == "error" and event["code"] == "spool_full" and event["sequence_number"] == 2


# ---------------------------------------------------------------- what Codex sends (issue 32)

SHELL = {
    "type": "function",
    "name": "exec",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
NAMESPACE = {
    "type": "namespace",
    "name": "shell",
    "description": "Shell tools",
    "tools": [SHELL, {"type": "custom", "name": "patch", "description": "freeform"}],
}
CODEX_TOOLS = [
    WEATHER,
    {"type": "web_search"},
    {"type": "file_search", "vector_store_ids": ["vs"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    NAMESPACE,
]


def test_namespace_tools_flatten_and_hosted_tools_are_left_out() -> None:
    """Codex 0.171's tools[4] (a namespace) was a 400; hosted tools were too. Now as vLLM's route shows them."""
    extras = {
        "store": False,
        "include": [],
        "prompt_cache_key": "k",
        "reasoning": {"effort": "low"},
        "client_metadata": {"a": "b"},
    }
    chat = D.to_chat({"model": "m", "input": "hi", "tools": CODEX_TOOLS, **extras}, None)
    assert [t["function"]["name"] for t in chat["tools"]] == ["get_weather", "shell__exec"]
    assert chat["tools"][1]["function"]["parameters"] == SHELL["parameters"]
    named = D.to_chat(
        {"model": "m", "input": "hi", "tools": CODEX_TOOLS, "tool_choice": {"type": "function", "name": "exec"}}, None
    )
    assert named["tool_choice"] == {"type": "function", "function": {"name": "shell__exec"}}
    only_hosted = D.to_chat(
        {"model": "m", "input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "auto"}, None
    )
    assert "tools" not in only_hosted and "tool_choice" not in only_hosted


def test_a_namespaced_call_comes_back_namespaced_and_resent_flat() -> None:
    request = {"model": "m", "input": "ls", "tools": CODEX_TOOLS}
    call = {"id": "call_1", "type": "function", "function": {"name": "shell__exec", "arguments": '{"cmd": "ls"}'}}
    body = D.reply(chat_reply({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"), ex(request))
    response = assert_full_response(body)
    [item] = [i for i in body["output"] if i["type"] == "function_call"]
    assert (item["namespace"], item["name"]) == ("shell", "exec")
    assert [t.type for t in response.tools] == [
        "function",
        "web_search",
        "file_search",
        "code_interpreter",
        "namespace",
    ]
    resent = D.to_chat(
        {
            "model": "m",
            "tools": CODEX_TOOLS,
            "input": [
                {"role": "user", "content": "ls"},
                item,
                {"type": "function_call_output", "call_id": "call_1", "output": "a"},
            ],
        },
        None,
    )
    assert resent["messages"][1]["tool_calls"][0]["function"]["name"] == "shell__exec"
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "shell__exec", "arguments": '{"cmd": "ls"}'},
                    }
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    evs, result = run_stream(chunks, StreamEnd("tool_calls", USAGE), request)
    added = next(e for e in evs if e["type"] == "response.output_item.added")
    assert (added["item"]["namespace"], added["item"]["name"]) == ("shell", "exec")
    assert (result["output"][0]["namespace"], result["output"][0]["name"]) == ("shell", "exec")


def test_an_ambiguous_namespaced_choice_is_refused_as_the_engine_refuses_it() -> None:
    other = {**NAMESPACE, "name": "other"}
    with pytest.raises(InvalidRequest) as err:
        D.to_chat(
            {
                "model": "m",
                "input": "hi",
                "tools": [NAMESPACE, other],
                "tool_choice": {"type": "function", "name": "exec"},
            },
            None,
        )
    assert err.value.param == "tool_choice.name"
