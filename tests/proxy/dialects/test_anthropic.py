"""The Anthropic Messages translation, without HTTP: request → chat body, reply → Message, stream → events.

Replies and streams are checked with the anthropic SDK's own types and its own stream
accumulator, so "the SDK parses it" is tested, not assumed.
"""

from __future__ import annotations

import warnings
from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent, Usage
from anthropic.types.shared.error_response import ErrorResponse
from pydantic import TypeAdapter

from proxy.dialects import anthropic as dialect
from proxy.dialects import anthropic_out as out
from proxy.dialects.anthropic_schema import MESSAGE
from proxy.dialects.anthropic_stream import MessageStream
from proxy.dialects.base import StreamEnd
from proxy.errors import InvalidRequest, Unavailable, UpstreamError

CALC = {
    "name": "calculator",
    "description": "Evaluate arithmetic",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def bad(request: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        dialect.to_chat(request)
    return info.value


# --------------------------------------------------------------------------- request


def test_minimal_request_maps_to_chat() -> None:
    assert dialect.to_chat(body()) == {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def test_system_string_and_blocks_and_claude_code_extras_are_accepted() -> None:
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
        {"type": "text", "text": "You are ", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "helpful."},
    ]
    request = body(
        system=system,
        thinking={"type": "adaptive"},
        service_tier="auto",
        metadata={"user_id": "user_42"},
        context_management={},
        container=None,
        mcp_servers=[],
    )
    request["messages"] = [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "hi",
                    "cache_control": {"type": "ephemeral"},
                    "citations": None,
                    "unknown_field": 1,
                }
            ],
        }
    ]
    chat = dialect.to_chat(request)
    assert chat["messages"] == [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}]
    assert chat["user"] == "user_42"
    assert set(chat) == {"model", "max_tokens", "messages", "user"}  # nothing vendor-specific reaches the engine
    assert dialect.to_chat(body(system="Be brief."))["messages"][0] == {"role": "system", "content": "Be brief."}


def test_tool_use_and_tool_result_round_trip_as_chat_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "17*3?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me compute."},
                {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "17*3"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "51"}, {"type": "text", "text": "ok"}],
                },
                {"type": "text", "text": "So?"},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "...", "signature": "s"}, {"type": "text", "text": "51"}],
        },
    ]
    chat = dialect.to_chat(body(messages=messages, tools=[CALC], tool_choice={"type": "auto"}))
    assert chat["messages"] == [
        {"role": "user", "content": "17*3?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "17*3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "51\nok"},
        {"role": "user", "content": "So?"},
        {"role": "assistant", "content": "51"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate arithmetic",
                "parameters": CALC["input_schema"],
            },
        }
    ]
    assert chat["tool_choice"] == "auto"


def test_tool_result_only_turn_adds_no_user_message() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "calculator", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "done"}]},
    ]
    chat = dialect.to_chat(body(messages=messages, tools=[CALC]))
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool"]


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "calculator", "disable_parallel_tool_use": True},
            {"type": "function", "function": {"name": "calculator"}},
            False,
        ),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any, parallel: bool | None) -> None:
    chat = dialect.to_chat(body(tools=[{**CALC, "strict": True}], tool_choice=choice))
    assert chat["tool_choice"] == expected
    assert chat.get("parallel_tool_calls") == parallel
    assert chat["tools"][0]["function"]["strict"] is True


def test_integral_numbers_are_integers() -> None:
    assert dialect.to_chat(body(max_tokens=16.0, top_k=5.0))["max_tokens"] == 16
    assert bad(body(max_tokens=16.5)).param == "max_tokens"


def test_sampling_and_stop_sequences() -> None:
    chat = dialect.to_chat(body(temperature=0, top_p=0.9, top_k=5, stop_sequences=["END"], stream=True))
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["stop"], chat["stream"]) == (
        0,
        0.9,
        5,
        ["END"],
        True,
    )


def test_system_messages_inside_messages_stay_where_they_stand() -> None:
    """Claude Code 2.1's reminders: once a 400 (messages.1.role), now system chat messages in place."""
    messages = [
        {"role": "user", "content": "a"},
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                {"type": "text", "text": "remind "},
                {"type": "text", "text": "me", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "calculator", "input": {}}]},
        {"role": "system", "content": "between a call and its result"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "51"}]},
        {"role": "system", "content": "x-anthropic-billing-header: cc=2;"},  # nothing left: no message
        {"role": "system", "content": []},
    ]
    chat = dialect.to_chat(body(system="top", messages=messages, tools=[CALC]))
    assert [(m["role"], m.get("content")) for m in chat["messages"]] == [
        ("system", "top"),
        ("user", "a"),
        ("system", "remind me"),
        ("assistant", None),
        ("system", "between a call and its result"),
        ("tool", "51"),
    ]
    documented = [role for shape in MESSAGE["oneOf"] for role in shape["properties"]["role"]["enum"]]
    assert sorted(documented) == ["assistant", "system", "user"]


def test_server_tools_are_dropped_not_refused() -> None:
    chat = dialect.to_chat(body(tools=[{"type": "web_search_20250305", "name": "web_search"}, CALC]))
    assert [t["function"]["name"] for t in chat["tools"]] == ["calculator"]


def test_a_tool_result_whose_tool_use_is_not_in_the_previous_message_is_served_as_the_engine_serves_it() -> None:
    """A harness that trimmed its history sends one; vLLM's /v1/messages renders it as a tool message (the corpus
    case ``sdk_tool_result_without_tool_use`` has the engine's prompt ids), and so do we."""
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "1"}]}
    assert dialect.to_chat(body(messages=[orphan]))["messages"] == [
        {"role": "tool", "tool_call_id": "nope", "content": "1"}
    ]
    late = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "c", "input": {}}]},
        {"role": "user", "content": "b"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    assert dialect.to_chat(body(messages=late))["messages"][-1] == {"role": "tool", "tool_call_id": "t", "content": ""}


def test_a_thinking_budget_below_max_tokens_is_accepted_and_ignored() -> None:
    request = body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024})
    assert dialect.to_chat(request) == dialect.to_chat(body(max_tokens=2048))


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (body(max_tokens=0), "max_tokens"),
        (body(messages=[]), "messages"),
        (body(messages=[{"role": "user", "content": []}]), "messages"),
        (body(messages=[{"role": "developer", "content": "x"}]), "messages.0.role"),  # the engine refuses it too
        (body(messages=[{"role": "system", "content": 7}]), "messages.0.content"),
        (
            body(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "1"}]}]),
            "messages.0.content.0.tool_use_id",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}]),
            "messages.0.content.0.type",
        ),
        (body(tools=[{"name": "calc"}]), "tools.0.input_schema"),
        (body(tools=[{"name": "calc", "input_schema": {"type": "string"}}]), "tools.0.input_schema.type"),
        (body(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]), "tools.0.name"),
        (body(tools=[CALC], tool_choice={"type": "tool", "name": "other"}), "tool_choice.name"),
        (body(tool_choice={"type": "any"}), "tool_choice"),
        (body(temperature="hot"), "temperature"),
        (body(system=[{"type": "image"}]), "system.0"),
        # thinking as the engine's route (and Anthropic's API) checks it
        (body(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking.budget_tokens"),  # >= max_tokens
        (body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 512}), "thinking.budget_tokens"),
        (body(thinking={"type": "on"}), "thinking.type"),
    ],
)
def test_bad_input_names_the_field(request_: dict[str, Any], param: str) -> None:
    exc = bad(request_)
    assert exc.param == param and exc.message.startswith(param + ":"), exc.message
    envelope = out.error_body(exc, "msg_1")
    assert envelope["type"] == "error" and envelope["error"]["type"] == "invalid_request_error"
    assert out.error_status(exc) == 400


def test_error_envelope_uses_anthropic_statuses() -> None:
    assert out.error_status(Unavailable("full")) == 529
    assert out.error_status(UpstreamError("x")) == 500
    for exc in (Unavailable("full"), UpstreamError("x"), bad(body(max_tokens=None))):
        typed = ErrorResponse.model_validate(out.error_body(exc, "msg_1"))  # the SDK's own error type
        assert typed.type == "error" and typed.request_id == "msg_1"
    assert out.error_body(Unavailable("full"))["error"]["type"] == "overloaded_error"


def test_count_tokens_body_renders_as_a_call_would() -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [CALC], "system": "s"}
    out = dialect.count_tokens_body(request)
    assert out["messages"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert out["add_generation_prompt"] is True and out["tools"][0]["function"]["name"] == "calculator"


# --------------------------------------------------------------------------- replies and streams


def text_reply(text: str, finish: str = "stop", matched: Any = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "stop_reason": matched,
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }


TOOL_ARGS = '{"expression": "17*3"}'


def tool_reply() -> dict[str, Any]:
    call = {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "calculator", "arguments": TOOL_ARGS}}
    reply = text_reply("", finish="stop")  # a forced (named) call finishes with "stop"
    reply["choices"][0]["message"] = {"role": "assistant", "content": "", "tool_calls": [call]}
    return reply


def chunks_for(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks vLLM streams for ``reply`` (content split in two, arguments in pieces, usage last)."""
    choice = reply["choices"][0]
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    out = [
        {
            **head,
            "prompt_token_ids": list(range(12)),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
    ]
    text = choice["message"].get("content") or ""
    for part in (text[: len(text) // 2], text[len(text) // 2 :]):
        if part:
            out.append({**head, "choices": [{"index": 0, "delta": {"content": part}, "token_ids": [1]}]})
    for i, call in enumerate(choice["message"].get("tool_calls") or ()):
        out.append(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "token_ids": [2],
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": i,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": call["function"]["name"]},
                                }
                            ]
                        },
                    }
                ],
            }
        )
        args = call["function"]["arguments"]
        for piece in (args[:5], args[5:]):
            out.append(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "token_ids": [3],
                            "delta": {"tool_calls": [{"index": i, "function": {"arguments": piece}}]},
                        }
                    ],
                }
            )
    out.append(
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "finish_reason": choice["finish_reason"],
                    "stop_reason": choice.get("stop_reason"),
                }
            ],
        }
    )
    out.append({**head, "choices": [], "usage": reply["usage"]})
    return out


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for frame in raw.split(b"\n\n"):
        if not frame.strip():
            continue
        name, data = frame.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: ")
        event = orjson.loads(data[6:])
        assert event["type"] == name[7:].decode()
        events.append(event)
    return events


def streamed(reply: dict[str, Any]) -> tuple[list[dict[str, Any]], Message, dict[str, Any] | None]:
    state = MessageStream("msg_1", "alias")
    raw = b"".join(state.feed(c) for c in chunks_for(reply)) + state.close()
    events = parse_sse(raw)
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}  # type: ignore[var-annotated]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for event in events:
            snapshot = accumulate_event(event=adapter.validate_python(event), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    return events, Message.model_validate(snapshot.model_dump()), state.result


@pytest.mark.parametrize(
    ("reply", "reason", "sequence"),
    [
        (text_reply("Hello there"), "end_turn", None),
        (text_reply("Hello", "length"), "max_tokens", None),
        (text_reply("Hi", "stop", "END"), "stop_sequence", "END"),
        (text_reply("Hi", "stop", 2), "end_turn", None),
        (tool_reply(), "tool_use", None),
        (text_reply(""), "end_turn", None),
    ],
)
def test_reply_and_stream_agree_and_parse_in_the_sdk(reply: dict[str, Any], reason: str, sequence: str | None) -> None:
    message = out.from_chat(reply, "msg_1", "alias")
    typed = Message.model_validate(message)
    assert (typed.stop_reason, typed.stop_sequence) == (reason, sequence)
    assert (typed.usage.input_tokens, typed.usage.output_tokens) == (12, 3)
    assert set(Message.model_fields) <= set(message) and set(Usage.model_fields) <= set(message["usage"])
    events, assembled, result = streamed(reply)
    assert assembled.model_dump() == typed.model_dump()
    assert result == message  # what the record keeps as the client's reply
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0]["message"]["usage"]["input_tokens"] == 12  # known at the first chunk from the prompt ids


def test_tool_stream_events_in_order() -> None:
    events, assembled, _ = streamed(tool_reply())
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1]["content_block"] == {
        "type": "tool_use",
        "id": "chatcmpl-tool-1",
        "name": "calculator",
        "input": {},
    }
    assert "".join(e["delta"]["partial_json"] for e in events[2:4]) == TOOL_ARGS
    assert assembled.content[0].input == {"expression": "17*3"}  # type: ignore[union-attr]


def test_each_chunk_is_translated_as_it_arrives() -> None:
    state = MessageStream("msg_1", "alias")
    chunks = chunks_for(text_reply("Hello there"))
    assert [e["type"] for e in parse_sse(state.feed(chunks[0]))] == ["message_start"]
    assert [e["type"] for e in parse_sse(state.feed(chunks[1]))] == ["content_block_start", "content_block_delta"]
    assert [e["type"] for e in parse_sse(state.feed(chunks[2]))] == ["content_block_delta"]
    assert state.feed(chunks[3]) == b""  # the finish chunk: stop reason waits for usage
    assert [e["type"] for e in parse_sse(state.feed(chunks[4]))] == ["content_block_stop", "message_delta"]
    assert [e["type"] for e in parse_sse(state.close())] == ["message_stop"]
    assert parse_sse(state.ping()) == [{"type": "ping"}]


def test_stream_cut_short_still_closes_with_counted_tokens() -> None:
    state = MessageStream("msg_1", "alias")
    raw = b"".join(state.feed(c) for c in chunks_for(text_reply("Hello there"))[:3]) + state.close()
    events = parse_sse(raw)
    assert [e["type"] for e in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2]["usage"]["output_tokens"] == 2  # token ids seen so far


def test_a_final_assistant_turn_is_continued() -> None:
    prefill = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    chat = dialect.to_chat(body(messages=prefill))
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
    assert "continue_final_message" not in dialect.to_chat(body())


def test_a_failed_stream_ends_in_an_error_event() -> None:
    state = MessageStream("msg_1", "alias")
    raw = b"".join(state.feed(c) for c in chunks_for(text_reply("Hello there"))[:3])
    raw += state.close(StreamEnd("timeout", None, "the engine went silent past the idle timeout"))
    events = parse_sse(raw)
    assert events[-1] == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "the engine went silent past the idle timeout"},
    }
    assert "message_stop" not in [e["type"] for e in events]
    assert state.result is not None and state.result["content"][0]["text"] == "Hello there"


def test_output_config_format_asks_the_engine_for_json() -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}}
    chat = dialect.to_chat(body(output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}}))
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert "response_format" not in dialect.to_chat(body(output_config={"effort": "high"}))  # effort: ignored


def test_delta_template_is_the_same_bytes_as_the_event() -> None:
    from proxy.dialects.anthropic_stream import sse

    state = MessageStream("msg_1", "alias")
    state.feed(chunks_for(text_reply("x"))[0])
    state.feed(chunks_for(text_reply("x"))[1])  # opens block 0
    text = 'a "quote", é, \\ and a\nnewline'
    assert state._delta(b"text_delta", b"text", text) == sse(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    )
