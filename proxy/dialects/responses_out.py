"""The Responses API's client-facing objects, built from the engine's chat replies.

Every field the openai SDK's ``Response`` type defines is present (null where we have
nothing to say), so strict clients and typed SDKs parse what we send; nothing captured
for training (token ids, logprobs nobody asked for) ever appears in them.
"""

from __future__ import annotations

import os
import time
from typing import Any

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


def item_id(prefix: str) -> str:
    """A fresh output item id (``msg_``, ``fc_``, ``rs_``)."""
    return prefix + os.urandom(12).hex()


def tools_echo(tools: Any) -> list[dict[str, Any]]:
    """The request's function tools as the ``Response`` type lists them (every field present)."""
    out = []
    for tool in tools or ():
        echo = {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
                "parameters": tool.get("parameters"), "strict": tool.get("strict")}  # fmt: skip
        out.append(echo)
    return out


def envelope(ex: Exchange, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``Response`` object around ``output``: the request's settings echoed, usage to be filled in."""
    body = ex.request
    return {
        "id": ex.id,
        "object": "response",
        "created_at": ex.created,
        "status": status,
        "background": False,
        "completed_at": None,
        "conversation": None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "metadata": body.get("metadata") or {},
        "model": ex.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_options": None,
        "prompt_cache_retention": body.get("prompt_cache_retention"),
        "prompt_cache_diagnostics": None,
        "reasoning": body.get("reasoning"),
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default",
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": tools_echo(body.get("tools")),
        "top_logprobs": body.get("top_logprobs"),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "usage": None,
        "user": body.get("user"),
        "access_programs": None,
        "image": None,
        "input_transformations": None,
        "moderation": None,
        "tool_usage": None,
    }


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


def function_call_item(id_: str, status: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": id_, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments, "namespace": None, "caller": None, "async": None}  # fmt: skip


def reasoning_item(id_: str, status: str, text: str) -> dict[str, Any]:
    return {"id": id_, "type": "reasoning", "status": status, "summary": [], "encrypted_content": None,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def logprobs_out(chat_logprobs: Any, top: int) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` → the Responses ``Logprob`` list (only when the client included it)."""
    out = []
    for entry in (chat_logprobs or {}).get("content") or ():
        alternatives = [
            {"token": t["token"], "logprob": t["logprob"], "bytes": t.get("bytes") or []}
            for t in (entry.get("top_logprobs") or ())[:top]
        ]
        out.append({"token": entry["token"], "logprob": entry["logprob"], "bytes": entry.get("bytes") or [],
                    "top_logprobs": alternatives})  # fmt: skip
    return out


def output_items(
    message: dict[str, Any], finish_reason: str | None, logprobs: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """A chat reply's assistant message as Responses output items: reasoning, text, then function calls."""
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
        items.append(function_call_item(item_id("fc_"), "completed", call.get("id") or item_id("call_"),
                                        fn.get("name") or "", fn.get("arguments") or ""))  # fmt: skip
    return items
