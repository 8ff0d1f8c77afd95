"""The Anthropic Messages dialect: a Messages request becomes the engine's chat body, and back.

Pure functions, no I/O: the proxy's one call path sends the chat body, captures the
engine's token ids and logprobs, and hands the reply (or each stream chunk, see
:mod:`proxy.dialects.anthropic_stream`) back here to become what Anthropic would send.
This module holds the request's messages and the :class:`AnthropicDialect`; ``thinking``, ``tools``
and ``tool_choice`` are checked in :mod:`proxy.dialects.anthropic_options`, replies and errors are
shaped in :mod:`proxy.dialects.anthropic_out`, and the request's OpenAPI documentation is
:mod:`proxy.dialects.anthropic_schema`.

The translation mirrors vLLM's own ``/v1/messages`` (system blocks joined, one text
block as a plain string, ``tool_result`` blocks as ``tool`` messages ahead of the
user's text, ``tool_use`` input as ``json.dumps``) so the same request renders to the
same prompt tokens through either door; the reference tests compare the two.

What the engine cannot do is accepted and ignored, never a 400 (Claude Code sends
all of it): ``cache_control`` and unknown fields on blocks, ``thinking`` (checked as the engine checks it),
``service_tier``, ``output_config.effort``, ``speed``, ``container``, ``mcp_servers``,
``context_management``, ``thinking`` and ``redacted_thinking`` blocks in the history, server tools (a ``type`` other
than ``custom``), the ``anthropic-version``/``anthropic-beta`` headers and ``?beta=true``.
``system`` messages inside ``messages`` (Claude Code's per-turn reminders) become system chat messages
where they stand, as vLLM's route renders them for a template that takes them anywhere.
What would silently change the meaning is refused, naming the field: images and
documents (the model takes text only), malformed tools. A ``tool_result`` whose ``tool_use`` is not in
the previous assistant message is served, as the engine's route serves it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from proxy.dialects.anthropic_options import chat_tools, check_thinking, integer, tool_choice
from proxy.dialects.anthropic_options import fail as _fail
from proxy.dialects.anthropic_out import error_body, error_status, from_chat
from proxy.dialects.anthropic_stream import MessageStream
from proxy.dialects.base import Dialect, DialectStream, Exchange, Stored
from proxy.errors import ApiError

ROLES = ("user", "assistant")
# Claude Code prefixes its system prompt with a per-request attribution hash; kept, it would
# change the prompt (and the message-prefix link key) every turn. vLLM drops it too.
BILLING_HEADER = "x-anthropic-billing-header"
IGNORED_BLOCKS = ("thinking", "redacted_thinking")
REFUSED_BLOCKS = ("image", "document", "search_result", "container_upload")


# --------------------------------------------------------------------------- request


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body for a Messages request (``model`` still the client's alias)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "field required: a model name from GET /v1/models")
    max_tokens = integer(body.get("max_tokens"))
    if max_tokens is None:
        raise _fail("max_tokens", "field required (the Messages API has no default output length)")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _fail("max_tokens", "must be an integer of at least 1 (0, cache pre-warming, is not served here)")
    check_thinking(body.get("thinking"), max_tokens)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages", "must be a non-empty list of {role, content} objects")
    chat_messages = _system(body.get("system"))
    for i, message in enumerate(messages):
        _message(message, f"messages.{i}", chat_messages)
    if not chat_messages:
        # Every message had an empty content list: there is nothing to answer (the engine would 400 too).
        raise _fail("messages", "hold no content: give at least one non-empty message")
    out: dict[str, Any] = {"model": model, "messages": chat_messages, "max_tokens": max_tokens}
    if chat_messages[-1]["role"] == "assistant" and isinstance(chat_messages[-1].get("content"), str):
        # A final assistant turn is a prefill: Anthropic continues it rather than starting a new turn.
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    if "stream" in body:
        if not isinstance(body["stream"], bool):
            raise _fail("stream", "must be true or false")
        out["stream"] = body["stream"]
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
                raise _fail(name, f"must be a number from {low:g} to {high:g}")
            out[name] = value
    top_k = integer(body.get("top_k"))
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise _fail("top_k", "must be a non-negative integer")
        out["top_k"] = top_k or -1  # 0: no top-k cut, vLLM's -1
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise _fail("stop_sequences", "must be a list of non-empty strings")
        if stops:
            out["stop"] = list(stops)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _fail("metadata", "must be an object")
    if metadata and metadata.get("user_id") is not None:
        out["user"] = str(metadata["user_id"])  # the end user, recorded; the engine ignores it
    output = body.get("output_config")
    fmt = output.get("format") if isinstance(output, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _fail("output_config.format.schema", "must be a JSON Schema object")
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    tools = chat_tools(body.get("tools"))
    choice = tool_choice(body.get("tool_choice"), tools)
    if tools:
        out["tools"] = tools
        out["tool_choice"] = choice[0] if choice else "auto"
        if choice and choice[1]:
            out["parallel_tool_calls"] = False
    return out


def _text_of(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _fail(where, "must be a string or a list of text blocks")
    parts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise _fail(f"{where}.{j}", "must be a text block {type: 'text', text: string}")
        parts.append(block["text"])
    return "".join(parts)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, list):
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING_HEADER))]
    text = _text_of(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _inline_system(content: Any, where: str, out: list[dict[str, Any]]) -> None:
    """A ``system`` message inside ``messages`` (Claude Code's reminders): a system chat message where it stands.

    As vLLM's own route does for a chat template that takes system messages anywhere (ours: it
    renders [system, user, system, user]): its text blocks joined, billing headers dropped, no
    message when nothing is left. Blocks other than text (tool_addition, say) add no text there either.
    """
    if isinstance(content, str):
        text = "" if content.startswith(BILLING_HEADER) else content
    elif isinstance(content, list):
        parts = []
        for j, block in enumerate(content):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise _fail(f"{where}.content.{j}", "must be a content block {type, ...}")
            part = block.get("text")
            if block["type"] == "text" and isinstance(part, str) and part and not part.startswith(BILLING_HEADER):
                parts.append(part)
        text = "".join(parts)
    else:
        raise _fail(f"{where}.content", "must be a string or a list of text blocks")
    if text:
        out.append({"role": "system", "content": text})


def _message(message: Any, where: str, out: list[dict[str, Any]]) -> None:
    """Append one Messages turn as chat messages."""
    if not isinstance(message, dict):
        raise _fail(where, "must be an object {role, content}")
    role = message.get("role")
    if role == "system":
        _inline_system(message.get("content"), where, out)
        return
    if role not in ROLES:
        raise _fail(f"{where}.role", "must be 'user', 'assistant' or 'system'")
    content = message.get("content")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise _fail(f"{where}.content", "must be a string or a list of content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _fail(f"{at}.text", "must be a string")
            if block["text"]:
                texts.append(block["text"])
        elif kind == "tool_use":
            if role != "assistant":
                raise _fail(at, "tool_use blocks may only appear in assistant messages")
            calls.append(_tool_use(block, at))
        elif kind == "tool_result":
            if role != "user":
                raise _fail(at, "tool_result blocks may only appear in user messages")
            use_id = block.get("tool_use_id")
            if not isinstance(use_id, str) or not use_id:
                raise _fail(f"{at}.tool_use_id", "must be the id of the tool_use block it answers")
            # One whose tool_use is not in the previous message (a harness that trimmed its history) is
            # served as the engine's route serves it: a tool message all the same.
            out.append({"role": "tool", "tool_call_id": use_id, "content": _result_text(block.get("content"), at)})
        elif kind in IGNORED_BLOCKS:
            continue  # our model never writes these; an echoed history keeps them
        elif kind in REFUSED_BLOCKS:
            raise _fail(f"{at}.type", f"{kind} blocks are not supported: this model takes text only")
        else:
            raise _fail(f"{at}.type", f"unknown content block type {kind!r} (text, tool_use, tool_result)")
    message_out: dict[str, Any] = {"role": role}
    if texts:
        message_out["content"] = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    if calls:
        message_out["tool_calls"] = calls
    if role == "assistant" or texts:  # a user turn of tool results only adds no user message
        out.append(message_out)


def _tool_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not block["id"]:
        raise _fail(f"{at}.id", "tool_use blocks need a string id")
    if not isinstance(block.get("name"), str) or not block["name"]:
        raise _fail(f"{at}.name", "tool_use blocks need a tool name")
    args = block.get("input", {})
    if not isinstance(args, dict):
        raise _fail(f"{at}.input", "must be an object")
    # As vLLM's tool parsers write arguments, so a resent tool_use matches the call's captured reply
    # (message-prefix linking compares them) and renders as the engine's own /v1/messages would.
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _result_text(content: Any, at: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"{at}.content", "must be a string or a list of text blocks")
    parts = []
    for k, item in enumerate(content):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text" and isinstance(item.get("text"), str):
            parts.append(item["text"])
        elif kind in REFUSED_BLOCKS:
            raise _fail(f"{at}.content.{k}.type", f"{kind} blocks are not supported: this model takes text only")
        else:
            raise _fail(f"{at}.content.{k}", "tool_result content blocks must be text blocks")
    return "\n".join(parts)


def count_tokens_body(body: dict[str, Any]) -> dict[str, Any]:
    """The engine's ``/tokenize`` body for ``count_tokens``: the same rendering a call would get."""
    chat = to_chat({**body, "max_tokens": 1, "stream": False})
    out: dict[str, Any] = {"model": chat["model"], "messages": chat["messages"], "add_generation_prompt": True}
    if chat.get("tools"):
        out["tools"] = chat["tools"]
    return out


class AnthropicDialect(Dialect):
    """``POST /v1/messages`` served through the one chat call path (see :mod:`proxy.dialects.base`)."""

    name = "anthropic"
    paths: ClassVar[tuple[str, ...]] = ("/v1/messages",)
    id_prefix = "msg_"  # our completion id is the Message id, and x-request-id
    # A long prompt's prefill on a CPU engine can be silent for minutes; idle-timeout proxies
    # between harness and us (often 60 s) must see bytes. Anthropic's SDKs skip pings.
    ping_interval_s: float | None = 10.0

    def credentials(self, headers: dict[str, str]) -> str | None:
        """Anthropic clients send ``x-api-key``; a Bearer token (``ANTHROPIC_AUTH_TOKEN``) works too."""
        if headers.get("authorization"):
            return headers["authorization"]
        key = headers.get("x-api-key")
        return f"Bearer {key}" if key else None

    def to_chat(self, body: dict[str, Any], previous: Stored | None) -> dict[str, Any]:
        return to_chat(body)

    def reply(self, chat: dict[str, Any], ex: Exchange) -> dict[str, Any]:
        return from_chat(chat, ex.id, ex.model)

    def stream(self, ex: Exchange) -> DialectStream:
        return MessageStream(ex.id, ex.model)

    def error(self, exc: ApiError) -> tuple[int, dict[str, Any]]:
        return error_status(exc), error_body(exc)
