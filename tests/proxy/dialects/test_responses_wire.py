"""A Responses stream's events, written as bytes, equal byte for byte what orjson made of the dicts.

Every event of :class:`ResponsesStream` against the dict-built translator it replaced
(responses_reference.py), for representative requests, engine streams and endings. Item
ids and the clock are pinned so both sides draw the same ones.
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

import orjson
import pytest

from proxy.dialects.base import Exchange, StreamEnd
from proxy.dialects.responses import ResponsesDialect
from proxy.dialects.responses_out import _IDS
from proxy.errors import Unavailable
from tests.proxy.dialects.responses_reference import DictStream

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


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1700000123.75)


def same_ids() -> None:
    """Both sides draw the same item ids: the counter starts over."""
    _IDS.count = itertools.count()


def ex(request: dict[str, Any]) -> Exchange:
    return Exchange(id="resp_" + "ab" * 16, model="alias ✓", created=1700000000, request=request, chat={})


def test_a_request_value_nested_past_orjsons_limit_fails_a_stream_as_before() -> None:
    deep: Any = "x"
    for _ in range(254):  # inside the Response one level past orjson's limit
        deep = [deep]
    request = {"model": "m", "input": "hi", "metadata": {"k": deep}}
    for stream in (DictStream(ex(request), False), D.stream(ex(request))):
        with pytest.raises(orjson.JSONEncodeError):
            stream.open()


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
        chunk({"reasoning_content": " ok", "content": "A"}),
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
CACHED = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
# The last: an integer past 64 bits in the usage, which the stdlib writes (dump_json's fallback).
ENDS = [
    StreamEnd("stop", USAGE),
    StreamEnd("length", CACHED),
    StreamEnd("tool_calls"),
    StreamEnd("timeout", None, "the engine went silent"),
    StreamEnd("upstream_error"),
    StreamEnd("odd"),
    StreamEnd("stop", {"prompt_tokens": 1e30}),
]


@pytest.mark.parametrize("request_body", REQUESTS)
@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("end", ENDS, ids=[f"{e.termination}-{i}" for i, e in enumerate(ENDS)])
def test_every_stream_event_is_the_dicts_bytes(request_body: dict[str, Any], name: str, end: StreamEnd) -> None:
    logprobs = "include" in request_body
    same_ids()
    old = DictStream(ex(request_body), logprobs)
    expected = [old.open(), *(old.feed(copy.deepcopy(c)) for c in STREAMS[name]), old.close(end)]
    same_ids()
    new = D.stream(ex(request_body))
    got = [new.open(), *(new.feed(copy.deepcopy(c)) for c in STREAMS[name]), new.close(end)]
    assert got == expected
    assert new.result_json == old.result_json and new.result == old.result
    assert new.result_bytes() == old.result_bytes() == old.result_json
    failure = Unavailable("spool full", code="spool_full")
    assert new.fail(failure) == old.fail(failure)


def test_a_custom_tool_call_item_is_the_dicts_bytes() -> None:
    """The custom call item a stream writes from its template (no dict-built reference streamed them)."""
    from proxy.dialects import responses_out, responses_wire

    for input_ in ("", '*** Begin Patch\n+print("h\u00e9 \U0001f600")\n', "\u2028"):
        for call_id, name in (("call_1", "apply_patch"), ("c", "p \u2713")):
            item = responses_out.custom_tool_call_item("ctc_1", call_id, name, input_)
            assert responses_wire.custom_tool_call_item("ctc_1", call_id, name, orjson.dumps(input_)) == orjson.dumps(
                item
            )
