"""The judge's prompts: the operator's rubric around a transcript (absolute) or a group of attempts (relative).

The model is asked for an integer from 0 to :data:`SCALE_MAX` on a final
``Score:`` line (relative: one ``<letter>: <score>`` line per attempt, RULER
style: the attempts of one task side by side, so the judge compares rather than
guesses an absolute level). A comment, when there is one, is shown as the
user's feedback; with none the judge evaluates the conversation alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from string import ascii_uppercase
from typing import Any

SCALE_MAX = 10
MAX_ATTEMPTS = len(ascii_uppercase)

ABSOLUTE_SYSTEM = (
    "You grade an AI assistant's work.\n\nRubric:\n{rubric}\n\n"
    "Give one or two sentences of reasoning, then a last line exactly of the form "
    f"'Score: N' with N an integer from 0 (worst) to {SCALE_MAX} (best)."
)
RELATIVE_SYSTEM = (
    "You compare several attempts by an AI assistant at the same task.\n\nRubric:\n{rubric}\n\n"
    "Give one or two sentences of reasoning, then one line per attempt of the form "
    f"'A: N' (the attempt's letter, then an integer from 0 (worst) to {SCALE_MAX} (best))."
)
IMPLICIT_CLAUSE = (
    "A user message that follows an assistant answer may be the user's reaction to it: "
    "treat it as feedback on that answer."
)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)


def render_message(message: Mapping[str, Any]) -> str:
    """One chat message as a transcript line; tool calls shown by name and arguments."""
    role = str(message.get("role", "?"))
    text = _text(message.get("content"))
    for call in message.get("tool_calls") or []:
        fn = (call.get("function") or {}) if isinstance(call, Mapping) else {}
        text += f"\n[calls {fn.get('name', '?')}({fn.get('arguments', '')})]"
    return f"{role}: {text.strip()}"


def transcript(messages: Sequence[Mapping[str, Any]], max_chars: int = 6000) -> str:
    """The conversation as text; when too long the start is cut (the end is what gets graded)."""
    full = "\n\n".join(render_message(m) for m in messages)
    if len(full) <= max_chars:
        return full
    return "[… earlier turns cut …]\n" + full[-max_chars:]


def absolute_messages(
    rubric: str,
    conversation: Sequence[Mapping[str, Any]],
    comment: str | None = None,
    *,
    implicit: bool = False,
    max_chars: int = 6000,
) -> list[dict[str, str]]:
    """Messages asking for one score for one conversation (with the user's comment, if any)."""
    system = ABSOLUTE_SYSTEM.format(rubric=rubric.strip())
    if implicit:
        system += "\n\n" + IMPLICIT_CLAUSE
    user = "Conversation:\n\n" + transcript(conversation, max_chars)
    if comment and comment.strip():
        user += "\n\nFeedback the user gave on it:\n" + comment.strip()
    user += "\n\nGrade the assistant's last answer."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def relative_messages(
    rubric: str,
    attempts: Sequence[Sequence[Mapping[str, Any]]],
    comments: Sequence[str | None] | None = None,
    *,
    max_chars: int = 6000,
) -> list[dict[str, str]]:
    """Messages asking for one score per attempt of the same task (letters A, B, …)."""
    if not 1 <= len(attempts) <= MAX_ATTEMPTS:
        raise ValueError(f"relative mode takes 1 to {MAX_ATTEMPTS} attempts, got {len(attempts)}")
    budget = max(200, max_chars // len(attempts))
    parts = []
    for i, conversation in enumerate(attempts):
        block = f"Attempt {ascii_uppercase[i]}:\n\n" + transcript(conversation, budget)
        comment = comments[i] if comments else None
        if comment and comment.strip():
            block += "\n\nFeedback the user gave on it:\n" + comment.strip()
        parts.append(block)
    user = "\n\n---\n\n".join(parts) + "\n\nScore every attempt."
    return [
        {"role": "system", "content": RELATIVE_SYSTEM.format(rubric=rubric.strip())},
        {"role": "user", "content": user},
    ]


PROBABILITY_SYSTEM = "{rubric}\n\nReply with one word: {good} or {bad}."


def _first(conversation: Sequence[Mapping[str, Any]], role: str, last: bool = False) -> str:
    found = [m for m in conversation if isinstance(m, Mapping) and m.get("role") == role]
    return _text((found[-1] if last else found[0]).get("content")).strip() if found else ""


def probability_item(
    conversation: Sequence[Mapping[str, Any]], comment: str | None = None, *, max_chars: int = 6000
) -> str:
    """One session as a ``probability`` judge sees it: the question, the last answer and the comment.

    ``Question:`` is the first user message, ``Answer:`` the last assistant message, ``Review:``
    the comment (absent without one); an operator's examples are written in the same form.
    """
    share = max(100, max_chars // 3)
    lines = []
    if question := _first(conversation, "user"):
        lines.append("Question: " + question[:share])
    lines.append("Answer: " + _first(conversation, "assistant", last=True)[-share:])
    if comment and comment.strip():
        lines.append("Review: " + comment.strip()[:share])
    return "\n".join(lines)


def probability_messages(
    rubric: str,
    labels: tuple[str, str],
    examples: Sequence[tuple[str, bool]],
    conversation: Sequence[Mapping[str, Any]],
    comment: str | None = None,
    *,
    max_chars: int = 6000,
) -> list[dict[str, str]]:
    """Messages asking for one word, ``labels[0]`` (good) or ``labels[1]`` (bad), after worked examples.

    The examples are turns of their own (a user turn with the item, the assistant's one-word
    verdict): a small model follows a pattern it has just seen far better than a description of it.
    """
    good, bad = labels
    out = [{"role": "system", "content": PROBABILITY_SYSTEM.format(rubric=rubric.strip(), good=good, bad=bad)}]
    for text, is_good in examples:
        out += [{"role": "user", "content": text}, {"role": "assistant", "content": good if is_good else bad}]
    out.append({"role": "user", "content": probability_item(conversation, comment, max_chars=max_chars)})
    return out


def letters(n: int) -> list[str]:
    """The labels of ``n`` attempts."""
    return list(ascii_uppercase[:n])
