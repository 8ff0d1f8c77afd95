"""A Responses stream's events, written as bytes from templates, as the openai SDK reads them.

Every event of :class:`ResponsesStream`, for representative requests (nothing echoed, a little, everything the
envelope echoes), engine streams (text, tool calls, reasoning, logprobs, a second choice) and endings (stop,
length, tool calls, a timeout, an engine error): each is the SDK's own type for its ``type`` with no field that
type does not define, sequence numbers count 0, 1, 2, ..., each item's deltas add up to its ``.done`` text, the
items are the ones the stream was fed, and the terminal event carries the result the record stores. The same
against the engine's own ``/v1/responses`` stream, event by event on the corpus: test_responses_stream_oracle.py
(it replaced a byte-for-byte comparison with a frozen copy of the dict-built translator these templates once
matched).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseErrorEvent

from proxy.dialects.base import Exchange, StreamEnd
from proxy.dialects.responses import ResponsesDialect
from proxy.errors import Unavailable
from tests.proxy.dialects.test_responses_stream_oracle import normalised, parse, typed, untyped

D = ResponsesDialect()
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
LOGPROBS = ["message.output_text.logprobs"]
# Requests that echo nothing, a little, everything the envelope echoes (nulls, unicode and all).
REQUESTS: list[dict[str, Any]] = [
    {"model": "m", "input": "hi"},
    {"model": "m", "input": "hi", "max_output_tokens": 16, "stream": False},
    {
        "model": "m",
        "input": "hi",
        "instructions": 'be brief ✓ "quoted"',
        "temperature": None,
        "top_p": 0.5,
        "tools": [WEATHER, {"type": "function", "name": "f"}],
        "tool_choice": "required",
        "metadata": {"k": "v"},
        "text": {"format": {"type": "json_object"}},
        "truncation": "auto",
        "parallel_tool_calls": False,
        "user": "u",
        "previous_response_id": "resp_x",
        "reasoning": {"effort": "low"},
        "max_tool_calls": 3,
        "top_logprobs": 2,
        "prompt_cache_key": "k",
        "prompt_cache_retention": "24h",
        "safety_identifier": "s",
        "include": LOGPROBS,
    },
    {"model": "m", "input": "hi", "metadata": {}, "text": None, "truncation": "", "tools": [], "user": None},
]
TOP = [{"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -2.25}]
LP = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": TOP}]}
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def ex(request: dict[str, Any]) -> Exchange:
    return Exchange(id="resp_" + "ab" * 16, model="alias ✓", created=1700000000, request=request, chat={})


def test_a_request_value_nested_past_orjsons_limit_fails_a_stream_as_before() -> None:
    deep: Any = "x"
    for _ in range(254):  # inside the Response one level past orjson's limit
        deep = [deep]
    request = {"model": "m", "input": "hi", "metadata": {"k": deep}}
    with pytest.raises(orjson.JSONEncodeError):
        D.stream(ex(request)).open()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": LP, **extra}]
    return {"id": "c", "object": "chat.completion.chunk", "choices": choices}


TOOL_A = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather"}}
STREAMS: dict[str, list[dict[str, Any]]] = {
    "text": [
        chunk({"role": "assistant", "content": ""}),
        chunk({}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo \u2028\U0001f600"}),
        chunk({"content": "!"}, "stop"),
        chunk(None),
    ],
    "length": [chunk({"content": "a"}), chunk({"content": "b"}, "length")],
    "broken off": [chunk({"content": "a"}), chunk({"content": "b"})],
    "tools after text": [
        chunk({"content": "Checking."}),
        chunk({"tool_calls": [TOOL_A]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"name": "f", "arguments": "{}"}}]}, "tool_calls"),
    ],
    "reasoning then text": [
        chunk({"reasoning": "hm"}),
        chunk({"reasoning_content": " ok"}),
        chunk({"content": "A"}),
        chunk({"content": "B"}),
        chunk({}, "stop"),
    ],
    "second choice ignored": [
        chunk({"content": "a"}),
        {"choices": [{"index": 1, "delta": {"content": "z"}}]},
        chunk({}, "stop"),
    ],
    "nothing": [],
}
# What each stream's output items say: a message's text, a call's name and arguments, reasoning's text.
OUTPUT: dict[str, list[tuple[str, ...]]] = {
    "text": [("message", "Hello \u2028\U0001f600!")],
    "length": [("message", "ab")],
    "broken off": [("message", "ab")],
    "tools after text": [
        ("message", "Checking."),
        ("function_call", "get_weather", '{"city": "Paris"}'),
        ("function_call", "f", "{}"),
    ],
    "reasoning then text": [("reasoning", "hm ok"), ("message", "AB")],
    "second choice ignored": [("message", "a")],
    "nothing": [],
}
CACHED = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
ENDS = [
    StreamEnd("stop", USAGE),
    StreamEnd("length", CACHED),
    StreamEnd("tool_calls"),
    StreamEnd("timeout", None, "the engine went silent"),
    StreamEnd("upstream_error"),
    StreamEnd("odd"),
]
STATUS = {"stop": "completed", "length": "incomplete", "tool_calls": "completed", "odd": "completed"}


# Per delta event, the ``.done`` event its deltas add up to and that event's field for the whole text.
DONE = {
    "response.output_text.delta": ("response.output_text.done", "text"),
    "response.reasoning_text.delta": ("response.reasoning_text.done", "text"),
    "response.function_call_arguments.delta": ("response.function_call_arguments.done", "arguments"),
}
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def said(item: dict[str, Any]) -> tuple[str, ...]:
    if item["type"] == "message":
        return ("message", "".join(p["text"] for p in item["content"]))
    if item["type"] == "reasoning":
        return ("reasoning", "".join(p["text"] for p in item["content"]))
    return (item["type"], item["name"], item["arguments"])


def written(request: dict[str, Any], chunks: list[dict[str, Any]], end: StreamEnd) -> tuple[Any, bytes]:
    """A stream of ``chunks`` ended by ``end``, and all it wrote."""
    stream = D.stream(ex(request))
    raw = [stream.open(), *(stream.feed(copy.deepcopy(c)) for c in chunks), stream.close(end)]
    return stream, b"".join(raw)


@pytest.mark.parametrize("request_body", REQUESTS)
@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("end", ENDS, ids=[f"{e.termination}-{i}" for i, e in enumerate(ENDS)])
def test_every_stream_event_is_the_sdks_type(request_body: dict[str, Any], name: str, end: StreamEnd) -> None:
    stream, raw = written(request_body, STREAMS[name], end)
    events = parse(raw.decode())
    assert not [p for e in events for p in untyped(e)]
    plain = normalised(events)  # and sequence numbers 0, 1, 2, ...
    assert [e["type"] for e in plain[:2]] == ["response.created", "response.in_progress"]
    for kind, (done, field) in DONE.items():
        texts: dict[str, str] = {}
        for e in plain:
            if e["type"] == kind:
                texts[e["item_id"]] = texts.get(e["item_id"], "") + e["delta"]
        assert texts == {e["item_id"]: e[field] for e in plain if e["type"] == done and e["item_id"] in texts}
    items = [e["item"] for e in plain if e["type"] == "response.output_item.done"]
    assert [said(i) for i in items] == OUTPUT[name]
    final = plain[-1]
    status = STATUS.get(end.termination, "failed")
    assert final["type"] == TERMINAL[status] and final["response"]["status"] == status
    assert final["response"]["output"] == items
    assert stream.result_json is not None and stream.result == orjson.loads(stream.result_json)
    assert stream.result_bytes() == stream.result_json
    assert typed(Response.model_validate(stream.result)) == typed(events[-1].response)  # type: ignore[attr-defined]
    failure = parse(stream.fail(Unavailable("spool full", code="spool_full")).decode())
    assert isinstance(failure[0], ResponseErrorEvent) and not untyped(failure[0])
    assert failure[0].sequence_number == len(events) and failure[0].code == "spool_full"


def test_text_delta_and_done_logprobs_are_the_sdks_type_without_bytes_and_the_part_keeps_them() -> None:
    """The SDK's types for a text delta's and its .done event's logprobs have no ``bytes`` (vLLM's route leaves
    them out); the output_text part's have them, and keep them."""
    _, raw = written(REQUESTS[2], STREAMS["text"], ENDS[0])
    events = parse(raw.decode())
    assert not [p for e in events for p in untyped(e)]
    lps = [e.logprobs for e in events if e.type in ("response.output_text.delta", "response.output_text.done")]
    assert all(lps) and all(not hasattr(lp, "bytes") or lp.bytes is None for group in lps for lp in group)
    part = next(e.part for e in events if e.type == "response.content_part.done")
    assert part.logprobs and all(lp.bytes is not None for lp in part.logprobs)


def test_a_chunk_with_reasoning_and_text_ends_the_reasoning_first() -> None:
    """vLLM's route splits such a delta: reasoning, then text, then tool calls (no second reasoning item)."""
    both = [chunk({"reasoning": "hm"}), chunk({"reasoning_content": " ok", "content": "A"}), chunk({"content": "B"})]
    _, raw = written(REQUESTS[0], both, ENDS[0])
    items = [e["item"] for e in normalised(parse(raw.decode())) if e["type"] == "response.output_item.done"]
    assert [said(i) for i in items] == OUTPUT["reasoning then text"]


def test_a_usage_past_64_bits_is_written_exactly() -> None:
    """orjson stops at 64 bits; the stdlib writes the rest (dump_json's fallback). The SDK's int fields stop
    there too, so this terminal event is read as JSON."""
    stream, raw = written(REQUESTS[0], STREAMS["text"], StreamEnd("stop", {"prompt_tokens": 1e30}))
    terminal = json.loads(raw.decode().rstrip().rpartition("\n\n")[2].partition("data: ")[2])
    assert terminal["type"] == "response.completed" and terminal["response"]["usage"]["input_tokens"] == int(1e30)
    assert stream.result == terminal["response"] and stream.result_bytes() == stream.result_json
    assert stream.result_json is not None and str(int(1e30)).encode() in stream.result_json


def test_every_item_template_is_the_dicts_bytes() -> None:
    """Each output item a stream writes from its template is, byte for byte, what orjson makes of the dict
    :mod:`proxy.dialects.responses_out` builds for the same item (the non-streamed reply's)."""
    from proxy.dialects import responses_out as out
    from proxy.dialects import responses_wire as wire

    lp = out.logprobs_out(LP, 2)
    for text in ("", '*** Begin Patch\n+print("h\u00e9 \U0001f600")\n', "\u2028", "%s %d"):
        t = orjson.dumps(text)
        assert wire.text_part(t) == orjson.dumps(out.text_part(text))
        assert wire.text_part(t, orjson.dumps(lp)) == orjson.dumps(out.text_part(text, lp))
        for status in ("in_progress", "completed", "incomplete"):
            part = out.text_part(text)
            assert wire.message_item("msg_1", status, wire.text_part(t)) == orjson.dumps(
                out.message_item("msg_1", status, [part])
            )
            assert wire.reasoning_item("rs_1", status, t) == orjson.dumps(out.reasoning_item("rs_1", status, text))
            for call_id, name, namespace in (("call_1", "apply_patch", None), ("c", "p \u2713", "codex_tools")):
                assert wire.function_call_item("fc_1", status, call_id, name, t, namespace) == orjson.dumps(
                    out.function_call_item("fc_1", status, call_id, name, text, namespace)
                )
                assert wire.custom_tool_call_item("ctc_1", call_id, name, t) == orjson.dumps(
                    out.custom_tool_call_item("ctc_1", call_id, name, text)
                )
    assert wire.message_item("msg_1", "in_progress", b"") == orjson.dumps(out.message_item("msg_1", "in_progress", []))
