"""The client-facing side of the Gemini dialect: GenerateContentResponse bodies, usage, errors.

The shapes are the google-genai SDK's (``GenerateContentResponse``, ``Candidate``, ``Part``,
``FunctionCall``, ``GenerateContentResponseUsageMetadata``) in the REST API's camelCase; nothing
captured for training (token ids, logprobs) ever appears in them.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.errors import ApiError

GOOGLE_ERRORS = {  # our status -> (the status Google answers, its canonical status name)
    400: (400, "INVALID_ARGUMENT"),
    401: (401, "UNAUTHENTICATED"),
    403: (403, "PERMISSION_DENIED"),
    404: (404, "NOT_FOUND"),
    405: (405, "UNIMPLEMENTED"),  # a served path asked with another method
    409: (409, "ABORTED"),
    413: (413, "INVALID_ARGUMENT"),
    429: (429, "RESOURCE_EXHAUSTED"),
    499: (499, "CANCELLED"),
    502: (500, "INTERNAL"),  # the engine failed: Google has no 502
    503: (503, "UNAVAILABLE"),
    504: (504, "DEADLINE_EXCEEDED"),
}


def finish_reason(finish: str | None) -> str | None:
    """Gemini's ``finishReason`` for a chat finish reason (a function call ends with ``STOP``, as Gemini's do)."""
    if finish is None:
        return None
    if finish == "length":
        return "MAX_TOKENS"
    return "STOP" if finish in ("stop", "tool_calls") else "OTHER"


def usage(chat_usage: dict[str, Any] | None, prompt_ids: int = 0) -> dict[str, Any]:
    """``usageMetadata`` from chat usage (``prompt_ids``: the prompt's length when usage has none)."""
    chat_usage = chat_usage or {}
    prompt = int(chat_usage.get("prompt_tokens") or prompt_ids)
    output = int(chat_usage.get("completion_tokens") or 0)
    out: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output,
    }
    details = chat_usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and cached:
        out["cachedContentTokenCount"] = cached
    return out


def function_call(call_id: str | None, name: str | None, arguments: str | None) -> dict[str, Any]:
    """A ``functionCall`` part: ``args`` is the arguments object (``{}`` when the model wrote no valid object)."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        args = {}
    call: dict[str, Any] = {"name": name or "", "args": args if isinstance(args, dict) else {}}
    if call_id:
        call["id"] = call_id  # the client sends it back on its functionResponse; we match on it
    return {"functionCall": call}


def response(
    response_id: str, model: str, parts: list[dict[str, Any]], finish: str | None, usage_metadata: dict[str, Any]
) -> dict[str, Any]:
    """One GenerateContentResponse (a whole reply, or one streamed chunk)."""
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": usage_metadata,
        "modelVersion": model,
        "responseId": response_id,
    }


def from_chat(reply: dict[str, Any], response_id: str, model: str) -> dict[str, Any]:
    """The GenerateContentResponse for a non-streamed chat reply (its first choice)."""
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        parts.append(function_call(call.get("id"), fn.get("name"), fn.get("arguments")))
    return response(
        response_id,
        model,
        parts or [{"text": ""}],
        finish_reason(choice.get("finish_reason")) or "OTHER",
        usage(reply.get("usage")),
    )


def error_status(exc: ApiError) -> int:
    """The HTTP status Google uses for one of our errors."""
    return GOOGLE_ERRORS.get(exc.status, (exc.status, "UNKNOWN"))[0]


def error_body(exc: ApiError) -> dict[str, Any]:
    """Google's error envelope: ``{"error": {"code", "message", "status", "details"}}``; the field, when named,
    as a ``google.rpc.BadRequest`` field violation."""
    code, status = GOOGLE_ERRORS.get(exc.status, (exc.status, "UNKNOWN"))
    error: dict[str, Any] = {"code": code, "message": exc.message, "status": status}
    if exc.param:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": exc.param, "description": exc.message}],
            }
        ]
    return {"error": error}
