"""The client-facing side of the Anthropic Messages dialect: Message objects, usage, errors.

Every field the anthropic SDK's ``Message`` and ``Usage`` types define is present (null
where we have nothing to say), so typed clients parse what we send; nothing captured for
training (token ids, logprobs) ever appears in them.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.errors import ApiError

ANTHROPIC_ERRORS = {  # our status -> (Anthropic's status, error type)
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    409: (409, "conflict_error"),
    413: (413, "request_too_large"),
    429: (429, "rate_limit_error"),
    502: (500, "api_error"),  # the engine failed: Anthropic has no 502
    503: (529, "overloaded_error"),  # spool full or draining: retry later, as for 529
    504: (504, "timeout_error"),
}


def stop_reason(finish: str | None, matched: Any, tool_calls: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for a chat finish reason and vLLM's ``stop_reason``.

    A forced tool call finishes with ``stop``; the tool calls decide. A matched stop
    string is a ``str`` (an int is a stop token, i.e. a natural end).
    """
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if tool_calls or finish == "tool_calls":
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic usage from chat usage: input excludes cached reads, as Anthropic counts them."""
    chat_usage = chat_usage or {}
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    details = chat_usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else 0
    return {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": int(chat_usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "cache_creation": None,
        "inference_geo": None,
        "output_tokens_details": None,
        "server_tool_use": None,
        "service_tier": None,
        "speed": None,
    }


def tool_input(arguments: str | None) -> dict[str, Any]:
    """A tool call's arguments as the ``input`` object (``{}`` when the model wrote no valid object)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message_shell(message_id: str, model: str) -> dict[str, Any]:
    """A Message without content: the non-streamed reply's frame and ``message_start``'s body."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
        "container": None,
        "diagnostics": None,
        "usage": usage(None),
    }


def from_chat(reply: dict[str, Any], message_id: str, model: str) -> dict[str, Any]:
    """The Message for a non-streamed chat reply (its first choice)."""
    out = message_shell(message_id, model)
    choices = reply.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"], "citations": None})
    calls = message.get("tool_calls") or []
    for call in calls:
        fn = call.get("function") or {}
        block = {
            "type": "tool_use",
            "id": call.get("id"),
            "name": fn.get("name"),
            "input": tool_input(fn.get("arguments")),
        }
        content.append(block)
    out["content"] = content or [{"type": "text", "text": "", "citations": None}]
    out["stop_reason"], out["stop_sequence"] = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), bool(calls)
    )
    out["usage"] = usage(reply.get("usage"))
    return out


def error_status(exc: ApiError) -> int:
    """The HTTP status Anthropic uses for one of our errors."""
    return ANTHROPIC_ERRORS.get(exc.status, (exc.status, "api_error"))[0]


def error_body(exc: ApiError, request_id: str | None = None) -> dict[str, Any]:
    """Anthropic's error envelope: ``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    kind = ANTHROPIC_ERRORS.get(exc.status, (exc.status, "api_error"))[1]
    return {"type": "error", "error": {"type": kind, "message": exc.message}, "request_id": request_id}
