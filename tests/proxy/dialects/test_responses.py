"""The Responses dialect's translation, as pure functions: requests to chat, replies and streams back.

The SDK's own types are the judge of the shapes we send: every field ``Response``
defines is present, and every event parses as the SDK's ``ResponseStreamEvent``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from openai import NOT_GIVEN
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
        ({"tools": [WEATHER, {"type": "custom", "description": "d"}]}, "tools[1].name"),  # as the engine: a 400
        ({"tools": [{"type": "custom", "name": 5}]}, "tools[0].name"),
        ({"tools": [{"type": "custom", "name": ""}]}, "tools[0].name"),
        ({"tools": [{"type": "custom", "name": "p", "description": ["d"]}]}, "tools[0].description"),
        (
            {
                "tools": [
                    {"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark", "definition": "s"}}
                ]
            },
            "tools[0].format",
        ),  # the engine refuses a grammar too
        ({"tools": [{"type": "custom", "name": "p", "format": "text"}]}, "tools[0].format"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "p"}]}, "input[0].input"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": 5, "input": "x"}]}, "input[0].name"),
        ({"input": [{"type": "custom_tool_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": 5}]}, "input[0].output"),
        ({"tools": [WEATHER], "tool_choice": {"type": "custom", "name": "patch"}}, "tool_choice.name"),
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


# ---------------------------------------------------------------- custom tools (issue 32: the engine serves them)

PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "text"},
}
PATCH_TEXT = '*** Begin Patch\n*** Add File: a.py\n+print("h\u00e9 \U0001f600")\n*** End Patch\n'
# The one-string function vLLM's route (tool_parsers/utils.py, custom_tool_as_function_dict) shows the model.
SHIM = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}


def test_a_custom_tool_is_the_engines_one_string_function() -> None:
    """Codex's apply_patch (a custom tool) was a 400; now it is what vLLM's own route shows the model."""
    chat = D.to_chat({"model": "m", "input": "hi", "tools": [WEATHER, PATCH, {"type": "custom", "name": "x"}]}, None)
    assert chat["tools"][1:] == [
        {
            "type": "function",
            "function": {"name": "apply_patch", "parameters": SHIM, "description": PATCH["description"]},
        },
        {"type": "function", "function": {"name": "x", "parameters": SHIM}},  # no description: none shown
    ]
    assert list(chat["tools"][1]["function"]["parameters"]) == list(SHIM)  # the template writes it in this order
    assert "strict" not in chat["tools"][1]["function"]
    # A custom tool inside a namespace is not shown, as there; a named choice of either type names it.
    inside = D.to_chat({"model": "m", "input": "hi", "tools": [NAMESPACE]}, None)
    assert [t["function"]["name"] for t in inside["tools"]] == ["shell__exec"]
    for kind in ("custom", "function"):
        named = D.to_chat(
            {"model": "m", "input": "hi", "tools": [PATCH], "tool_choice": {"type": kind, "name": "apply_patch"}},
            None,
        )
        assert named["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    weather = D.to_chat(
        {
            "model": "m",
            "input": "hi",
            "tools": [WEATHER, PATCH],
            "tool_choice": {"type": "custom", "name": "get_weather"},
        },
        None,
    )
    assert weather["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def _custom_call(arguments: str, call_id: str = "chatcmpl-tool-7") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "apply_patch", "arguments": arguments}}


def test_a_custom_call_comes_back_as_a_custom_tool_call_and_is_resent_as_its_arguments() -> None:
    from openai.types.responses import ResponseCustomToolCall

    request = {"model": "m", "input": "add a.py", "tools": [PATCH, WEATHER]}
    arguments = json.dumps({"input": PATCH_TEXT})  # the model's escapes (\u00e9, \ud83d\ude00) are decoded
    reply = chat_reply({"role": "assistant", "content": None, "tool_calls": [_custom_call(arguments)]}, "tool_calls")
    body = D.reply(reply, ex(request))
    response = assert_full_response(body)
    [item] = body["output"]
    assert item == {
        "id": item["id"],
        "type": "custom_tool_call",
        "call_id": "chatcmpl-tool-7",
        "name": "apply_patch",
        "input": PATCH_TEXT,
        "namespace": None,
        "caller": None,
        "async": None,
    }
    assert item["id"].startswith("ctc_") and isinstance(response.output[0], ResponseCustomToolCall)
    assert [t.type for t in response.tools] == ["custom", "function"]
    # Resent (as the SDK dumps it) with its output, it is the call the model made: arguments as vLLM's route
    # writes them (json.dumps, non-ASCII kept), the output a tool message; previous_response_id says the same.
    sent = response.output[0].model_dump(exclude_none=True)
    follow = [{"type": "custom_tool_call_output", "call_id": "chatcmpl-tool-7", "output": "Done!"}]
    resent = D.to_chat({**request, "input": [{"role": "user", "content": "add a.py"}, sent, *follow]}, None)
    assert resent["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-7",
                    "type": "function",
                    "function": {
                        "name": "apply_patch",
                        "arguments": json.dumps({"input": PATCH_TEXT}, ensure_ascii=False),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "chatcmpl-tool-7", "content": "Done!"},
    ]
    prev = _previous(request, D.to_chat(request, None), reply)
    by_id = D.to_chat({**request, "input": follow, "previous_response_id": "resp_prev"}, prev)
    assert by_id["messages"] == resent["messages"]
    # Text and calls in one turn merge into one assistant message, as function calls do; parts are text.
    merged = D.to_chat(
        {
            **request,
            "input": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "On it."},
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": ""},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
            ],
        },
        None,
    )
    assert merged["messages"][1]["content"] == "On it."
    assert [c["function"]["arguments"] for c in merged["messages"][1]["tool_calls"]] == ['{"input": ""}', "{}"]
    assert merged["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "ok"}


@pytest.mark.parametrize(
    ("arguments", "input_"),
    [
        ('{"input": "a\\nb"}', "a\nb"),
        ('{"input":"x","extra":1}', "x"),
        ("*** Begin Patch", "*** Begin Patch"),  # not JSON: the text as it is, as the engine gives it
        ('{"input": 5}', '{"input": 5}'),  # no string input: the arguments
        ('["x"]', '["x"]'),
        ("", ""),
        ('{"input": "\\ud83d"}', "\ufffd"),  # a lone surrogate cannot be sent as UTF-8 (the engine would fail)
    ],
)
def test_a_custom_calls_input_is_what_its_arguments_decode_to(arguments: str, input_: str) -> None:
    body = D.reply(
        chat_reply({"role": "assistant", "content": "", "tool_calls": [_custom_call(arguments)]}, "tool_calls"),
        ex({"tools": [PATCH]}),
    )
    assert_full_response(body)
    assert [(i["type"], i["input"]) for i in body["output"]] == [("custom_tool_call", input_)]


def _custom_chunks(pieces: list[str], index: int = 0) -> list[dict[str, Any]]:
    head = {"index": index, "id": f"call_{index}", "type": "function", "function": {"name": "apply_patch"}}
    return [chunk({"tool_calls": [head]})] + [
        chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in pieces
    ]


def _sdk_stream(evs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """The openai SDK's own stream accumulator over the events: it checks their order and identities."""
    from openai.lib.streaming.responses import ResponseStreamState

    state: Any = ResponseStreamState(input_tools=tools, text_format=NOT_GIVEN)  # type: ignore[arg-type]
    for event in evs:
        state.handle_event(EVENTS.validate_python(event))
    return state._completed_response


def test_a_custom_call_streams_its_input_as_the_sdk_expects() -> None:
    arguments = json.dumps({"input": PATCH_TEXT})  # escapes the stream cuts in two: \u00e9, a surrogate pair
    cut = [arguments[i : i + 5] for i in range(0, len(arguments), 5)]
    request: dict[str, Any] = {"model": "m", "input": "x", "tools": [PATCH]}
    chunks = [chunk({"content": "Patching."}), *_custom_chunks(cut), chunk({}, "tool_calls")]
    evs, result = run_stream(chunks, StreamEnd("tool_calls", USAGE), request)
    kinds = [e["type"] for e in evs]
    deltas = [e["delta"] for e in evs if e["type"] == "response.custom_tool_call_input.delta"]
    n = len(deltas)
    assert kinds[-(n + 4) :] == [
        "response.output_item.added",
        *["response.custom_tool_call_input.delta"] * n,
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = evs[-(n + 4)], evs[-3]
    assert added["item"] == {**result["output"][1], "input": ""} and added["item"]["type"] == "custom_tool_call"
    assert "".join(deltas) == done["input"] == PATCH_TEXT and all(deltas)
    assert done["item_id"] == added["item"]["id"] and done["output_index"] == 1
    assert evs[-2]["item"] == result["output"][1] and result["output"][1]["input"] == PATCH_TEXT
    assert_full_response(result)
    final = _sdk_stream(evs, request["tools"])
    assert final.output[1].type == "custom_tool_call" and final.output[1].input == PATCH_TEXT
    # The stream adds up to what the non-streamed reply says (ids and times aside).
    whole = D.reply(
        chat_reply({"role": "assistant", "content": "Patching.", "tool_calls": [_custom_call(arguments, "call_0")]})
        | {"usage": USAGE},
        ex(request),
    )
    assert _strip_ids(whole) == _strip_ids(result)


@pytest.mark.parametrize(
    ("pieces", "deltas", "input_"),
    [
        (['{"input": "ab', "c ", 'd"}'], ["ab", "c", " d"], "abc d"),  # trailing blanks wait, as vLLM's parser
        (['{"in', 'put": "a\\', 'nb"}'], ["a", "\nb"], "a\nb"),  # a cut escape waits for its second half
        (['{"input": "a\\ud83d', '\\ude00"}'], ["a", "\U0001f600"], "a\U0001f600"),  # so does a pair's
        (["Begin ", "Patch"], ["Begin Patch"], "Begin Patch"),  # not JSON: all of it when the call closes
        (['{"input": "ab', '\\q"}'], ["ab", "", '{"input": "ab\\q"}'], '{"input": "ab\\q"}'),  # taken back, resent
        (['{"input": "ab"', ', "x": 1}'], ["ab"], "ab"),
        (['{"input": "ab"', ', "input": "c"}'], ["ab", "c"], "c"),  # not an extension: resent whole
    ],
)
def test_custom_input_deltas_follow_the_engines_rule(pieces: list[str], deltas: list[str], input_: str) -> None:
    """Deltas of the decoded input so far; at the end what the whole arguments decode to and was not sent
    (all of it again when it is not an extension of what was), after an empty delta when what was sent
    stopped being the input's start: vLLM's ``_emit_custom_tool_input_delta`` rule."""
    evs, result = run_stream(
        [*_custom_chunks(pieces), chunk({}, "tool_calls")], StreamEnd("tool_calls"), {"tools": [PATCH]}
    )
    assert [e["delta"] for e in evs if e["type"] == "response.custom_tool_call_input.delta"] == deltas
    assert result["output"][0]["input"] == input_
    assert next(e for e in evs if e["type"] == "response.custom_tool_call_input.done")["input"] == input_


def test_custom_and_function_calls_stream_as_their_own_items() -> None:
    tools = [PATCH, WEATHER]
    chunks = [
        *_custom_chunks(['{"input": "x"}']),
        chunk({"tool_calls": [{"index": 1, "id": "call_w", "type": "function", "function": {"name": "get_weather"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"city": "P"}'}}]}),
        *_custom_chunks(['{"input": "y"'], index=2),  # cut off: the stream broke
    ]
    evs, result = run_stream(chunks, StreamEnd("upstream_error", None, "gone"), {"tools": tools})
    assert [(i["type"], i.get("input"), i.get("arguments")) for i in result["output"]] == [
        ("custom_tool_call", "x", None),
        ("function_call", None, '{"city": "P"}'),
        ("custom_tool_call", '{"input": "y"', None),  # what vLLM's route decodes unfinished arguments to
    ]
    assert evs[-1]["type"] == "response.failed"
    assert [e["output_index"] for e in evs if e["type"] == "response.output_item.added"] == [0, 1, 2]
