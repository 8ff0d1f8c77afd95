"""Implicit feedback: in a multi-turn session, the user's next message is a comment on the answer before it.

"That's wrong, it should be a subtraction" after an answer says as much as a
grader's comment would. Pure over stored completion rows: a call's request
messages are its parent's messages, the parent's reply, then what came next;
when the first message after that reply is the user's, it is hindsight on the
parent's answer. Tool results in between are not (the model asked for them), nor is a
user message that starts with one of the project's ``implicit_feedback_skip`` prefixes: a
harness's text protocol may hand a tool's output back as a user message (``RESULT: 945``).
Off by default per project (``settings["implicit_feedback"]``); it feeds the judge and
self-distillation, and never stands in for explicit feedback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IMPLICIT = "implicit"


@dataclass(frozen=True)
class Hindsight:
    """The user's next message, read as feedback on ``completion_id``'s answer."""

    completion_id: str
    session_id: str
    text: str
    by_completion_id: str  # the call whose request carried the user's message


def _messages(call: Any) -> list[dict[str, Any]] | None:
    messages = (call.request or {}).get("messages")
    return messages if isinstance(messages, list) else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _reply(call: Any) -> dict[str, Any] | None:
    first = (call.choices or [{}])[0] or {}
    message = first.get("message")
    return message if isinstance(message, dict) else None


def _extends(parent: Any, child: Any) -> bool:
    """Whether ``child``'s messages start with ``parent``'s messages and reply (compared by role and text)."""
    before, after, reply = _messages(parent), _messages(child), _reply(parent)
    if before is None or after is None or reply is None or len(after) <= len(before) + 1:
        return False
    same = [(m.get("role"), _text(m.get("content"))) for m in before + [reply]]
    return same == [(m.get("role"), _text(m.get("content"))) for m in after[: len(before) + 1]]


def next_turn_feedback(calls: Sequence[Any], skip: Sequence[str] = ()) -> list[Hindsight]:
    """Hindsight per answered call of the given rows (one session's or several, in time order).

    A next user message starting with one of ``skip`` is a tool's output in a text protocol: none.
    """
    prefixes = tuple(skip)
    by_id = {c.id: c for c in calls}
    seen: dict[str, list[Any]] = {}
    out: list[Hindsight] = []
    for child in calls:
        earlier = seen.setdefault(child.session_id, [])
        parent = by_id.get(child.parent_id) if child.parent_id else None
        if parent is None or not _extends(parent, child):
            parent = next((p for p in reversed(earlier) if _extends(p, child)), None)
        earlier.append(child)
        if parent is None:
            continue
        following = (_messages(child) or [])[len(_messages(parent) or []) + 1]
        text = _text(following.get("content")).strip()
        if following.get("role") == "user" and text and not (prefixes and text.startswith(prefixes)):
            out.append(Hindsight(parent.id, parent.session_id, text, child.id))
    return out
