"""The Responses API's client-facing objects, built from the engine's chat replies.

Every field the openai SDK's ``Response`` type defines is present (null where we have
nothing to say), so strict clients and typed SDKs parse what we send; nothing captured
for training (token ids, logprobs nobody asked for) ever appears in them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from typing import Any

import orjson

from proxy.dialects.base import Exchange

# Chat finish reason -> (Response status, incomplete_details.reason).
FINISH_STATUS: dict[str, tuple[str, str | None]] = {
    "stop": ("completed", None),
    "tool_calls": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}
TERMINATION_STATUS: dict[str, tuple[str, str | None]] = {
    **FINISH_STATUS,
    "timeout": ("failed", None),
    "upstream_error": ("failed", None),
}


class _ItemIds:
    """Output item ids need to be unique, not unguessable (the response id, which names a stored call,
    stays 128 random bits): this process's 64 random bits and a counter, 24 hex digits as before,
    without a system call per item (``os.urandom`` is one)."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.base = os.urandom(8).hex()
        self.count = itertools.count()


_IDS = _ItemIds()
os.register_at_fork(after_in_child=_IDS.reseed)  # a forked worker must not repeat its parent's ids


def item_id(prefix: str) -> str:
    """A fresh output item id (``msg_``, ``fc_``, ``ctc_``, ``rs_``, ``call_``)."""
    return f"{prefix}{_IDS.base}{next(_IDS.count):08x}"


NAMESPACE_SEPARATOR = "__"  # vLLM's: a namespaced function is shown to the model as <namespace>__<name>


def flat_name(namespace: str, name: str) -> str:
    """The name the model calls a namespaced function by (vLLM's ``flat_namespace_tool_name``)."""
    return namespace + NAMESPACE_SEPARATOR + name


def namespaced_names(tools: Any) -> dict[str, tuple[str, str]]:
    """Flat name → (namespace, name) for the request's namespace tools: how a call is given back."""
    names: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for function in tool.get("tools") or ():
                if isinstance(function, dict) and function.get("type") == "function":
                    names[flat_name(tool["name"], str(function.get("name")))] = (tool["name"], function["name"])
    return names


# A ``custom`` tool (free-form text in, no JSON schema) is shown to the model the way vLLM's own route shows
# it: a function whose one required string parameter is this key, and its calls come back as custom calls.
CUSTOM_INPUT_KEY = "input"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def custom_names(tools: Any) -> frozenset[str]:
    """The names of the request's top-level ``custom`` tools: a call to one is given back as a custom call."""
    return frozenset(
        tool["name"]
        for tool in (tools if isinstance(tools, list) else ())
        if isinstance(tool, dict) and tool.get("type") == "custom" and isinstance(tool.get("name"), str)
    )


def encode_custom_input(text: str) -> str:
    """A custom call's ``input`` as the arguments of the function the model was shown: ``{"input": "..."}``
    with the stdlib's separators and non-ASCII kept (the string vLLM's route writes for the same item)."""
    return json.dumps({CUSTOM_INPUT_KEY: text}, ensure_ascii=False)


def decode_custom_input(arguments: str) -> str:
    """The model's arguments to a custom tool as its ``input``: the ``input`` string of a JSON object that
    has one, else the arguments as they are (what vLLM's route gives back for the same arguments)."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return arguments
    value = parsed.get(CUSTOM_INPUT_KEY) if isinstance(parsed, dict) else None
    return valid_text(value) if isinstance(value, str) else arguments


def valid_text(text: str) -> str:
    """``text`` with any lone surrogate (a ``\\ud83d`` escape without its pair) as U+FFFD: JSON escapes can
    spell them, UTF-8 cannot carry them."""
    if _LONE_SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def tools_echo(tools: Any) -> list[dict[str, Any]]:
    """The request's function tools as the ``Response`` type lists them (every field present)."""
    out = []
    for tool in tools or ():
        if tool.get("type", "function") != "function":
            out.append(tool)  # a namespace or hosted tool: the SDK's Response lists it as given
            continue
        echo = {
            "type": "function",
            "name": tool.get("name"),
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
            "strict": tool.get("strict"),
        }
        out.append(echo)
    return out


# Every field of the SDK's ``Response`` in its order, with what it holds unless the request says otherwise.
_ENVELOPE: dict[str, Any] = dict.fromkeys(
    (
        "id",
        "object",
        "created_at",
        "status",
        "background",
        "completed_at",
        "conversation",
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "output",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "prompt_cache_diagnostics",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "usage",
        "user",
        "access_programs",
        "image",
        "input_transformations",
        "moderation",
        "tool_usage",
    )
)
# Echoed from the request as given (null when absent), and echoed with a default when absent.
_ECHOED = (
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "top_logprobs",
    "user",
)
_DEFAULTS = {"parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto", "top_p": 1.0}
_ENVELOPE.update(object="response", background=False, service_tier="default", truncation="disabled", **_DEFAULTS)
_FROM_REQUEST = frozenset(_ECHOED).union(_DEFAULTS)  # what the request's own value replaces, even a null


def envelope(ex: Exchange, status: str, output: list[dict[str, Any]] | orjson.Fragment) -> dict[str, Any]:
    """A ``Response`` object around ``output`` (items, or their bytes: a stream's), the request's settings
    echoed, usage to be filled in.

    Copied from a template that holds every default (one per call, or two for a stream): about half the
    cost of a 39-key literal; only the fields the request names are looked at."""
    body = ex.request
    response = _ENVELOPE.copy()
    response["id"], response["created_at"], response["status"] = ex.id, ex.created, status
    response["model"], response["output"] = ex.model, output
    for key in _FROM_REQUEST.intersection(body):
        response[key] = body[key]
    response["metadata"] = body.get("metadata") or {}
    response["text"] = body.get("text") or {"format": {"type": "text"}}
    if body.get("truncation"):
        response["truncation"] = body["truncation"]
    tools = body.get("tools")
    response["tools"] = tools_echo(tools) if tools else []
    return response


def finish(response: dict[str, Any], termination: str, usage: dict[str, Any] | None, error: str | None) -> None:
    """Stamp a ``Response`` with how it ended: status, incomplete reason or error, usage."""
    status, reason = TERMINATION_STATUS.get(termination, ("completed", None))
    response["status"] = status
    if reason:
        response["incomplete_details"] = {"reason": reason}
    if status == "failed":
        response["error"] = {"code": "server_error", "message": error or f"the engine call ended: {termination}"}
    else:
        response["completed_at"] = int(time.time())
    response["usage"] = usage_of(usage)


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage → Responses usage (the same token counts under Responses' names)."""
    if not chat_usage:
        return None
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    completion = int(chat_usage.get("completion_tokens") or 0)
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(chat_usage.get("total_tokens") or prompt + completion),
    }


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(id_: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id_, "type": "message", "role": "assistant", "status": status, "content": parts, "phase": None}


def function_call_item(
    id_: str, status: str, call_id: str, name: str, arguments: str, namespace: str | None = None
) -> dict[str, Any]:
    return {
        "id": id_,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "namespace": namespace,
        "caller": None,
        "async": None,
    }


def custom_tool_call_item(id_: str, call_id: str, name: str, input_: str) -> dict[str, Any]:
    """A call to a ``custom`` tool (the SDK's ``ResponseCustomToolCall``: it has no ``status``)."""
    return {
        "id": id_,
        "type": "custom_tool_call",
        "call_id": call_id,
        "name": name,
        "input": input_,
        "namespace": None,
        "caller": None,
        "async": None,
    }


def reasoning_item(id_: str, status: str, text: str) -> dict[str, Any]:
    return {
        "id": id_,
        "type": "reasoning",
        "status": status,
        "summary": [],
        "encrypted_content": None,
        "content": [{"type": "reasoning_text", "text": text}],
    }


def logprobs_out(chat_logprobs: Any, top: int) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` → the Responses ``Logprob`` list (only when the client included it)."""
    out = []
    for entry in (chat_logprobs or {}).get("content") or ():
        alternatives = [
            {"token": t["token"], "logprob": t["logprob"], "bytes": t.get("bytes") or []}
            for t in (entry.get("top_logprobs") or ())[:top]
        ]
        out.append(
            {
                "token": entry["token"],
                "logprob": entry["logprob"],
                "bytes": entry.get("bytes") or [],
                "top_logprobs": alternatives,
            }
        )
    return out


def event_logprobs(logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``logprobs_out``'s list as the text delta and ``.done`` events carry it: without ``bytes`` (the SDK's
    types for those two events have none, and vLLM's own route leaves them out; the part and the item keep them)."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]],
        }
        for e in logprobs
    ]


def output_items(
    message: dict[str, Any],
    finish_reason: str | None,
    logprobs: list[dict[str, Any]] | None,
    names: dict[str, tuple[str, str]] | None = None,
    custom: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """A chat reply's assistant message as Responses output items: reasoning, text, then tool calls (a call
    to one of the ``custom`` tools named is a ``custom_tool_call`` with its ``input``)."""
    status = "incomplete" if finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if message.get("reasoning"):
        items.append(reasoning_item(item_id("rs_"), status, message["reasoning"]))
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    if text or not calls:
        items.append(message_item(item_id("msg_"), status, [text_part(text, logprobs)]))
    for call in calls:
        fn = call.get("function") or {}
        name = fn.get("name") or ""
        if name in custom:
            call_id = call.get("id") or item_id("call_")
            items.append(
                custom_tool_call_item(item_id("ctc_"), call_id, name, decode_custom_input(fn.get("arguments") or ""))
            )
            continue
        namespace, name = names.get(name, (None, name)) if names else (None, name)
        items.append(
            function_call_item(
                item_id("fc_"),
                "completed",
                call.get("id") or item_id("call_"),
                name,
                fn.get("arguments") or "",
                namespace,
            )
        )
    return items
