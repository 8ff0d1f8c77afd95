"""The OpenAI Responses API (``POST /v1/responses``) as a dialect of chat completions.

A Responses request becomes one engine chat call: ``instructions`` the system message,
``input`` (a string, or items: messages with text parts, ``function_call``,
``function_call_output``, ``custom_tool_call``, ``custom_tool_call_output``) the rest of the
messages, function tools and ``tool_choice`` their chat forms, ``max_output_tokens``
``max_tokens``, ``text.format`` a ``response_format``. ``previous_response_id`` prepends the
stored conversation: the previous call's engine-facing messages (its system message dropped:
instructions do not carry over, as in OpenAI's API and vLLM's) and its output items, converted
exactly as if the client had resent them, so both ways of continuing give the same chat
messages, the same link keys and one trajectory.

``namespace`` tools are flattened as vLLM's route flattens them (``<namespace>__<name>``) and
the model's call to one comes back namespaced; a ``custom`` tool is shown as that route shows
it, a function taking one string (``{"input": ...}``), and the model's call to it comes back as a
``custom_tool_call`` with that string as its ``input`` (resent, it is those arguments again);
hosted tools (``web_search``, ...) are left out of what the engine sees, as there. What would
change the answer and cannot be honoured (grammar-constrained custom tools, images, files,
``background``, ``conversation``, stored prompts, item references) is a 400 naming the
field; the rest of what SDKs send (``store``, ``include``, ``reasoning``, ``truncation``,
``prompt_cache_key``, ``service_tier``, ``user``, ...) is accepted and ignored.
"""

from __future__ import annotations

from typing import Any, ClassVar

from proxy import admission
from proxy.dialects.base import Dialect, DialectStream, Exchange, Stored
from proxy.dialects.responses_out import (
    custom_names,
    encode_custom_input,
    envelope,
    finish,
    flat_name,
    logprobs_out,
    namespaced_names,
    output_items,
)
from proxy.dialects.responses_stream import ResponsesStream
from proxy.dialects.responses_tools import chat_tools, tool_choice
from proxy.errors import ApiError, InvalidRequest

# Sampling fields with the same name and meaning in both APIs (vLLM's extras included).
PASSTHROUGH = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
)
# Accepted, answer-changing, and impossible here: refused with the field named.
REFUSED = {
    "background": "background responses are not supported; send the request and wait for it (or stream)",
    "conversation": "the Conversations API is not supported; continue with previous_response_id or resend the input",
    "prompt": "stored prompt templates are not supported; send instructions and input",
}
# The request as OpenAPI documents it: what is checked here; anything else is accepted (and ignored, or
# refused with the field named when it would change the answer).
_TEXT = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"enum": ["input_text", "output_text"]}, "text": {"type": "string"}},
}
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT}]}
_ITEMS = [
    {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "type": {"enum": ["message"]},
            "role": {"enum": ["user", "assistant", "system", "developer"]},
            "content": _CONTENT,
        },
    },
    {
        "type": "object",
        "required": ["type", "call_id", "name", "arguments"],
        "properties": {
            "type": {"enum": ["function_call"]},
            "call_id": {"type": "string"},
            "name": {"type": "string"},
            "arguments": {"type": "string"},
        },
    },
    {
        "type": "object",
        "required": ["type", "call_id", "output"],
        "properties": {
            "type": {"enum": ["function_call_output"]},
            "call_id": {"type": "string", "minLength": 1},
            "output": _CONTENT,
        },
    },
]
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "minLength": 1, "description": "an alias from GET /v1/models"},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"anyOf": _ITEMS}}]},
        "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "stream": {"type": "boolean"},
    },
}
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesDialect(Dialect):
    name = "responses"
    paths: ClassVar[tuple[str, ...]] = ("/v1/responses",)
    id_prefix = "resp_"
    previous_param = "previous_response_id"

    def previous_id(self, body: dict[str, Any]) -> str | None:
        value = body.get("previous_response_id")
        if value is None:
            return None
        return admission.call_id(value, "previous_response_id")  # the limit of the column it is looked up in

    def to_chat(self, body: dict[str, Any], previous: Stored | None) -> dict[str, Any]:
        """The engine-facing chat body for a Responses request (see the module docstring)."""
        for field, why in REFUSED.items():
            if body.get(field) not in (None, False):
                raise InvalidRequest(f"'{field}': {why}", param=field, code="unsupported_parameter")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required: an alias from GET /v1/models", param="model")
        messages: list[dict[str, Any]] = []
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise InvalidRequest("'instructions' must be a string", param="instructions")
            messages.append({"role": "system", "content": instructions})
        if previous is not None:
            messages.extend(history(previous))
        messages.extend(input_messages(body.get("input")))
        chat: dict[str, Any] = {"model": model, "messages": messages}
        for key in PASSTHROUGH:
            if body.get(key) is not None:
                chat[key] = body[key]
        if body.get("max_output_tokens") is not None:
            limit = body["max_output_tokens"]
            if isinstance(limit, float) and limit.is_integer():
                limit = int(limit)  # 16.0 is an integer to JSON Schema
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
                raise InvalidRequest("'max_output_tokens' must be a positive integer", param="max_output_tokens")
            chat["max_tokens"] = limit
        tools = chat_tools(body.get("tools"))
        if tools:
            chat["tools"] = tools
        choice = body.get("tool_choice")
        if choice is not None and (tools or choice not in ("auto", "none")):  # hosted tools only: nothing to choose
            chat["tool_choice"] = tool_choice(choice, tools)
        response_format = text_format(body.get("text"))
        if response_format is not None:
            chat["response_format"] = response_format
        if wants_logprobs(body):
            chat["logprobs"] = True
            chat["top_logprobs"] = int(body.get("top_logprobs") or 0)
        chat["stream"] = self.stream_requested(body)
        return chat

    def reply(self, chat: dict[str, Any], ex: Exchange) -> dict[str, Any]:
        choice = (chat.get("choices") or [{}])[0]
        finish_reason = choice.get("finish_reason")
        logprobs = None
        if wants_logprobs(ex.request):
            logprobs = logprobs_out(choice.get("logprobs"), int(ex.request.get("top_logprobs") or 0))
        tools = ex.request.get("tools")
        message = choice.get("message") or {}
        items = output_items(message, finish_reason, logprobs, namespaced_names(tools), custom_names(tools))
        response = envelope(ex, "completed", items)
        finish(response, "length" if finish_reason == "length" else "stop", chat.get("usage"), None)
        return response

    def stream(self, ex: Exchange) -> DialectStream:
        return ResponsesStream(ex, wants_logprobs(ex.request))

    def error(self, exc: ApiError) -> tuple[int, dict[str, Any]]:
        """The Responses API answers errors in OpenAI's envelope, as every other route here does."""
        return exc.status, exc.body()


def wants_logprobs(body: dict[str, Any]) -> bool:
    include = body.get("include")
    return isinstance(include, list) and LOGPROBS_INCLUDE in include


def history(previous: Stored) -> list[dict[str, Any]]:
    """The messages a ``previous_response_id`` stands for: its chat messages (no system) and its output."""
    if previous.client_request is not None and previous.client_request.get("store") is False:
        raise InvalidRequest(
            f"response {previous.id!r} was created with store: false; resend the whole input instead",
            param="previous_response_id",
        )
    if previous.status_code != 200 or previous.client_response is None:
        raise InvalidRequest(
            f"response {previous.id!r} did not complete (status {previous.status_code}); it cannot be continued",
            param="previous_response_id",
        )
    earlier = [m for m in previous.request.get("messages") or () if m.get("role") != "system"]
    return earlier + input_messages(previous.client_response.get("output") or [], field="previous_response_id")


def input_messages(value: Any, field: str = "input") -> list[dict[str, Any]]:
    """``input`` (a string or a list of items) as chat messages; adjacent assistant items merge into one."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'{field}' must be a non-empty string or a non-empty list of items", param=field)
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object (an input item)", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if kind == "message":
            message = _message(item, where)
            if message is None:
                continue
            if last is not None and message["role"] == "assistant" and last.get("content") is None:
                last["content"] = message["content"]  # text after reasoning (or calls) of one turn
                continue
            messages.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            call = _function_call(item, where) if kind == "function_call" else _custom_tool_call(item, where)
            if last is not None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):  # both a tool message, as vLLM's
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(
                    f"'{where}.call_id' must name the {kind.removesuffix('_output')} it answers",
                    param=f"{where}.call_id",
                )
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")}
            )
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                raise InvalidRequest(
                    f"'{where}.encrypted_content': encrypted reasoning is not supported",
                    param=f"{where}.encrypted_content",
                )
            text = "".join(_part_text(p) for p in (item.get("content") or item.get("summary") or ()))
            if last is not None and last.get("reasoning") is None:
                last["reasoning"] = text
            else:
                messages.append({"role": "assistant", "content": None, "reasoning": text})
        else:
            raise InvalidRequest(
                f"'{where}.type': unsupported input item type {kind!r}; this proxy takes message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output and reasoning items",
                param=f"{where}.type",
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any] | None:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(f"'{where}.role' must be user, assistant, system or developer", param=f"{where}.role")
    content = item.get("content")
    if content is None:
        raise InvalidRequest(f"'{where}.content' is required", param=f"{where}.content")
    return {"role": role, "content": _text(content, f"{where}.content")}


def _text(content: Any, where: str) -> str:
    """Text content (a string or a list of text parts) as one string; other parts are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequest(
                f"'{where}[{j}]': content part {kind!r} is not supported (the model takes text only)",
                param=f"{where}[{j}]",
            )
        texts.append(_part_text(part))
    return "\n".join(texts)  # as vLLM's chat renderer joins a message's text parts


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return ""
    text = part.get("text", part.get("refusal", ""))
    return text if isinstance(text, str) else ""


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise InvalidRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    name = item["name"]
    if item.get("namespace"):  # a call the harness got back namespaced, resent as the model made it
        if not isinstance(item["namespace"], str):
            raise InvalidRequest(f"'{where}.namespace' must be a string", param=f"{where}.namespace")
        name = flat_name(item["namespace"], name)
    return {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}


def _custom_tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``custom_tool_call`` as the call the model made: the function it was shown, its ``input`` as the
    ``{"input": ...}`` arguments (as vLLM's route writes them; a ``namespace`` is not read there either)."""
    for key in ("call_id", "name", "input"):
        if not isinstance(item.get(key), str):
            raise InvalidRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": encode_custom_input(item["input"])},
    }


def text_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` → chat ``response_format`` (JSON schema or JSON object; plain text is the default)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", param="text.format")
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidRequest("'text.format.schema' must be a JSON schema object", param="text.format.schema")
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = bool(fmt["strict"])
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(f"'text.format.type' {fmt.get('type')!r} is not supported", param="text.format.type")
