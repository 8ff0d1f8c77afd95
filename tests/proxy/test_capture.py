"""Capture is pure: what we ask the engine for, what the client gets back, how streams add up."""

from __future__ import annotations

import copy
import json

import orjson

from proxy.capture import (
    Assembler,
    Wants,
    captured_choices,
    parse_cutting_ids,
    prepare,
    sampling_params,
    split_prompt_ids,
    strip,
)


def test_prepare_forces_capture_and_remembers_what_the_client_wanted() -> None:
    body = {"model": "support", "messages": [], "stream": True, "temperature": 0.7}
    out, wants = prepare(body, "chat", "support@v3")
    assert out["model"] == "support@v3" and out["logprobs"] is True and out["return_token_ids"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert wants == Wants(logprobs=False, token_ids=False, usage=False, stream=True)
    assert body["model"] == "support"  # the client's body is not mutated
    _, wants = prepare({**body, "logprobs": True, "stream_options": {"include_usage": True}}, "chat", "m")
    assert wants.logprobs and wants.usage
    out, wants = prepare({"model": "m", "prompt": "x"}, "completions", "m")
    assert out["logprobs"] == 0 and not wants.logprobs


def test_sampling_params_fill_engine_defaults() -> None:
    assert sampling_params({"temperature": 0.5, "max_tokens": 9}) == {
        "temperature": 0.5,
        "max_tokens": 9,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "n": 1,
    }


def test_strip_restores_what_the_engine_would_have_sent() -> None:
    reply = {
        "model": "support@v3",
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "token_ids": [5], "logprobs": {"content": [{"logprob": -1.0}]}}],
    }
    out = strip(copy.deepcopy(reply), Wants(False, False, False, False), "support")
    assert out == {
        "model": "support",
        "prompt_token_ids": None,
        "choices": [{"index": 0, "token_ids": None, "logprobs": None}],
    }
    kept = strip(copy.deepcopy(reply), Wants(True, True, False, False), "support")
    assert kept is not None and kept["choices"][0]["token_ids"] == [5] and kept["prompt_token_ids"] == [1, 2]
    usage_chunk = {"choices": [], "usage": {"total_tokens": 3}}
    assert strip(dict(usage_chunk), Wants(False, False, False, True), "a") is None
    assert strip(dict(usage_chunk), Wants(False, False, True, True), "a") is not None
    silent = {"choices": [{"index": 0, "delta": {}, "finish_reason": None, "token_ids": [7]}]}
    assert strip(copy.deepcopy(silent), Wants(False, False, False, True), "a") is None
    assert strip(copy.deepcopy(silent), Wants(False, True, False, True), "a") is not None


def test_assembler_adds_up_tokens_text_and_tool_calls() -> None:
    asm = Assembler("chat")
    asm.add(
        {
            "id": "x",
            "created": 1,
            "model": "m",
            "prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    )
    asm.add(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "Hel"},
                    "token_ids": [10, 11],
                    "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
                }
            ]
        }
    )
    asm.add(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "calc", "arguments": '{"e": '}}]
                    },
                    "token_ids": [12],
                    "logprobs": {"content": [{"logprob": -0.3}]},
                }
            ]
        }
    )
    asm.add(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"1+1"}'}}]},
                    "token_ids": [13],
                    "logprobs": {"content": [{"logprob": -0.4}]},
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    asm.add({"choices": [], "usage": {"completion_tokens": 4}})
    (choice,) = asm.captured_choices()
    assert choice["token_ids"] == [10, 11, 12, 13]
    assert choice["logprobs"] == [-0.1, -0.2, -0.3, -0.4]
    assert choice["message"]["content"] == "Hel"
    assert choice["message"]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "1+1"}'}}
    ]
    assert asm.prompt_token_ids == [1, 2, 3] and asm.usage == {"completion_tokens": 4}
    assert choice["finish_reason"] == "tool_calls"


def test_captured_choices_read_both_logprob_shapes() -> None:
    message = {"role": "assistant", "content": "a", "refusal": None}
    chat = {
        "choices": [
            {
                "index": 0,
                "token_ids": [1],
                "logprobs": {"content": [{"logprob": -2.0}]},
                "finish_reason": "stop",
                "message": message,
            }
        ]
    }
    (c,) = captured_choices(chat, "chat")
    assert c["logprobs"] == [-2.0] and c["message"] == {"role": "assistant", "content": "a"}
    text = {"choices": [{"index": 0, "token_ids": [1], "logprobs": {"token_logprobs": [-1.5]}, "text": "a"}]}
    assert captured_choices(text, "completions")[0]["logprobs"] == [-1.5]
    assert captured_choices({"choices": [{"index": 0, "logprobs": None}]}, "chat")[0]["logprobs"] is None


def test_prompt_ids_are_cut_out_as_the_engine_wrote_them() -> None:
    """A reply's top-level prompt ids come back as their JSON, the rest parsed with null there; a list
    that is not the reply's own, or not a list of numbers, is parsed as before."""
    ids = list(range(0, 5000, 7))
    reply = {"id": "c", "choices": [{"index": 0, "message": {"content": 'say "prompt_token_ids":[1]'}}]}
    raw = orjson.dumps({**reply, "prompt_token_ids": ids, "usage": {"prompt_tokens": len(ids)}})
    parsed, cut = parse_cutting_ids(raw, True)
    assert cut == orjson.dumps(ids) and orjson.loads(cut) == ids
    assert parsed == {**reply, "prompt_token_ids": None, "usage": {"prompt_tokens": len(ids)}}
    assert parse_cutting_ids(raw, False) == (orjson.loads(raw), None)
    spaced = json.dumps({**reply, "prompt_token_ids": ids}).encode()  # another serialiser's spacing
    parsed, cut = parse_cutting_ids(spaced, True)
    assert cut is not None and json.loads(cut) == ids and parsed["prompt_token_ids"] is None
    nested = orjson.dumps({"choices": [{"prompt_token_ids": [1, 2]}], "prompt_token_ids": None})
    assert parse_cutting_ids(nested, True) == (orjson.loads(nested), None)  # a choice's list: not the reply's
    for odd in ([[1], [2]], [{"a": 1}], ["1]"], []):
        raw = orjson.dumps({"prompt_token_ids": odd, "x": 1})
        parsed, cut = parse_cutting_ids(raw, True)
        assert (parsed, cut) == ((orjson.loads(raw), None) if odd else ({"prompt_token_ids": None, "x": 1}, b"[]"))
    assert split_prompt_ids(b'{"prompt_token_ids":[1,2') == (b'{"prompt_token_ids":[1,2', None)
