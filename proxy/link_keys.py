"""What the harness named a call, and the link keys that find its parent: pure functions, no I/O.

A call's *link key* hashes its request messages plus the assistant message it
returned. The next turn of the same conversation starts with exactly those
messages, so it finds its parent by hashing its own message prefixes. Messages
are compared after normalisation (role, text, tool calls, tool call id), not as
tokens: the chat template re-renders the assistant turn differently from the
sampled ids.

The key chain starts from a *scope* (:func:`link_scope`): the API key and the end
user the client names (``user``, ``metadata.user_id``, ``metadata.end_user``), so
linking never crosses callers. :class:`proxy.sessions.Linker` looks the keys up.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import InvalidRequest


@dataclass(frozen=True)
class Naming:
    """What the harness told us about a call: session, task, tags, its own request id."""

    session_id: str | None
    task_id: str | None
    tags: tuple[str, ...]
    client_request_id: str | None
    source: str  # header | metadata | path | (resolved later) linked | new | ambiguous_link
    end_user: str | None = None  # ``user``, ``metadata.user_id`` or ``metadata.end_user``: linking stays within it


def naming(headers: Any, body: dict[str, Any], path_session: str | None) -> Naming:
    """Read the session, task and tags from headers, ``metadata`` or the base-URL path."""
    raw_meta = body.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    session, source = headers.get("x-session-id"), "header"
    if not session and meta.get("session_id"):
        session, source = str(meta["session_id"]), "metadata"
    if not session and path_session:
        session, source = path_session, "path"
    task = headers.get("x-task-id") or (str(meta["task_id"]) if meta.get("task_id") else None)
    raw_tags = headers.get("x-onthejob-tags") or meta.get("tags") or ""
    if isinstance(raw_tags, str):
        tags = tuple(t.strip() for t in raw_tags.split(",") if t.strip())
    else:
        tags = tuple(str(t) for t in raw_tags)
    for field, value in (("metadata.session_id", session), ("metadata.task_id", task)):
        if value and ("\x00" in value or len(value) > 200):
            raise InvalidRequest(f"{field} must be at most 200 characters with no NUL character", param=field)
    user = body.get("user") or meta.get("user_id") or meta.get("end_user")
    end_user = str(user) if isinstance(user, str | int) and not isinstance(user, bool) else None
    harness = harness_tags(headers, body)
    if harness:
        tags = tuple(dict.fromkeys((*tags, *harness)))
    return Naming(session or None, task, tags, headers.get("x-client-request-id"), source, end_user)


def harness_tags(headers: Any, body: dict[str, Any]) -> tuple[str, ...]:
    """Tags from what a known coding-agent harness says about a call in its own headers.

    Claude Code (``User-Agent: claude-cli/...``): ``harness:claude-code``; its session
    (``X-Claude-Code-Session-Id``, shared by the agent loop and its side calls) as
    ``claude-code-session:<id>``; a call without tools is a side call (a title, a summary:
    its agent loop always sends its tools) and gets ``side-call``; a subagent's call
    (``x-claude-code-agent-id``) gets ``subagent``. Codex (``originator: codex_...``):
    ``harness:codex``, ``codex-thread:<id>``, and ``side-call`` where its
    ``x-codex-turn-metadata`` names a ``request_kind`` other than ``turn``. Other callers: none.
    """
    agent = headers.get("user-agent") or ""
    if agent.startswith("claude-cli/"):
        out = ["harness:claude-code"]
        _id_tag(out, "claude-code-session", headers.get("x-claude-code-session-id"))
        if not body.get("tools"):
            out.append("side-call")
        if headers.get("x-claude-code-agent-id"):
            out.append("subagent")
        return tuple(out)
    if (headers.get("originator") or "").startswith("codex") or agent.startswith("codex"):
        out = ["harness:codex"]
        _id_tag(out, "codex-thread", headers.get("thread-id") or headers.get("session-id"))
        raw = headers.get("x-codex-turn-metadata")
        try:
            turn = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            turn = None
        kind = turn.get("request_kind") if isinstance(turn, dict) else None
        if isinstance(kind, str) and kind != "turn":
            out.append("side-call")
        return tuple(out)
    return ()


def _id_tag(out: list[str], name: str, value: str | None) -> None:
    """``name:value`` when the harness's id is a short printable one (ids are uuids; anything else is left out)."""
    if value and len(value) <= 64 and value.isprintable() and "," not in value:
        out.append(f"{name}:{value}")


def link_scope(key_id: str | None, end_user: str | None) -> str | None:
    """Where a conversation's key chain starts: one API key and one end user (None: neither is known)."""
    if key_id is None and end_user is None:
        return None
    return hashlib.sha256(orjson.dumps(["scope", key_id, end_user])).hexdigest()


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones in order
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as one JSON text whatever their whitespace.

    vLLM streams a call's arguments as sampled (``{\n    "x": 1\n}`` under guided decoding)
    but returns them re-serialised (``{"x": 1}``) when not streaming, and a client that
    resends a parsed call (the Anthropic and Responses dialects, any SDK that keeps
    ``input`` as an object) re-serialises them again: all of these are one turn. The
    form is ``json.dumps``' default, which vLLM's own non-streamed arguments already have,
    so their keys are unchanged.
    """
    if not isinstance(raw, str) or not raw:
        return raw
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:  # not JSON (a model's malformed call): compared as written
        return raw


def normalise(message: dict[str, Any]) -> bytes:
    """A canonical byte form of one chat message."""
    calls = [
        [(c.get("function") or {}).get("name", ""), _arguments((c.get("function") or {}).get("arguments", ""))]
        for c in (message.get("tool_calls") or [])
        if isinstance(c, dict)
    ]
    return orjson.dumps(
        [
            message.get("role", ""),
            _content_text(message.get("content")),
            calls,
            message.get("tool_call_id") or "",
            message.get("name") or "",
        ]
    )


def prefix_keys(messages: list[dict[str, Any]], scope: str | None = None) -> list[str]:
    """Chained hashes: keys[j] identifies messages[: j + 1] within ``scope`` (:func:`link_scope`)."""
    keys: list[str] = []
    for message in messages:
        keys.append(_extend_remembered(keys[-1] if keys else scope, message))
    return keys


# The keys of recently hashed (key, message) pairs: a conversation's next turn resends its whole history,
# and each message of it already hashed (by the previous turn's request, or as that turn's reply) is found
# here instead of normalised and hashed again, so a call hashes only what is new. Found by the text's length
# and ends (never hashing the whole text), then confirmed by comparing the text whole (a memcmp).
# Held: the texts of the newest MEMO_BYTES of messages; a message past them is hashed, as before.
MEMO_BYTES = 32 * 1024 * 1024
_ENDS = 48
_MemoKey = tuple[str | None, str, int, str, str, str, str]
_memo: dict[_MemoKey, tuple[str, str]] = {}  # → (the message's text, its key)
_memo_bytes = 0


def _memo_key(key: str | None, message: dict[str, Any]) -> tuple[_MemoKey, str] | None:
    """Where a plain text message's key is remembered, and its text (None for any other message)."""
    if message.get("tool_calls"):
        return None
    role, text = message.get("role", ""), message.get("content")
    call_id, name = message.get("tool_call_id") or "", message.get("name") or ""
    if type(role) is str and type(text) is str and type(call_id) is str and type(name) is str:
        return (key, role, len(text), text[:_ENDS], text[-_ENDS:], call_id, name), text
    return None


def _extend_remembered(key: str | None, message: dict[str, Any]) -> str:
    """:func:`extend_key`, remembered for plain text messages (what :func:`normalise` reads of one is in
    :func:`_memo_key`: its role, text, tool call id and name)."""
    global _memo_bytes
    found = _memo_key(key, message) if isinstance(message, dict) else None
    if found is None:
        return extend_key(key, message)
    memo_key, text = found
    held = _memo.get(memo_key)
    if held is not None and held[0] == text:
        return held[1]
    extended = extend_key(key, message)
    if held is None:
        _memo_bytes += len(text) + 200
    else:  # the same length and ends, another text: the newer one is kept
        _memo_bytes += len(text) - len(held[0])
    _memo[memo_key] = (text, extended)
    while _memo_bytes > MEMO_BYTES and _memo:
        oldest = next(iter(_memo))
        _memo_bytes -= len(_memo.pop(oldest)[0]) + 200
    return extended


def extend_key(key: str | None, message: dict[str, Any]) -> str:
    """The key of a prefix (``key``; None for the empty one) followed by ``message``."""
    return hashlib.sha256((bytes.fromhex(key) if key else b"") + normalise(message)).hexdigest()


def link_key(prompt_key: str | None, reply: dict[str, Any] | None) -> str | None:
    """The key a follow-up call will find: the request's messages (``prompt_key``) plus the returned message."""
    if reply is None or prompt_key is None:
        return None
    return _extend_remembered(prompt_key, reply)
