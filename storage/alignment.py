"""Aligning a sampled turn with the next call's prompt: where the re-rendered assistant turn ends there,
and which tokens end a turn in this session's chat template (inferred from its prompts, no tokenizer).
:mod:`storage.trajectories` builds trajectories on these."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any, Protocol


class LinkedCall(Protocol):
    """What the inference reads of a call (:class:`storage.trajectories.CallRow` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def parent_id(self) -> str | None: ...
    @property
    def prompt_ids(self) -> list[int] | None: ...
    @property
    def messages(self) -> list[dict[str, Any]] | None: ...
    @property
    def choices(self) -> list[dict[str, Any]]: ...


def infer_end_of_turn(calls: Sequence[LinkedCall]) -> frozenset[int]:
    """End-of-turn token candidates, from the session's own prompts (no tokenizer).

    A chat template closes every message with the same token. Between a call and
    its child, that token's count grows by exactly the number of messages added;
    in the earlier prompt it occurs once per message (plus one for an implicit
    system prompt or the generation prompt's header). Content tokens rarely pass
    both tests for every linked pair.
    """
    by_id = {c.id: c for c in calls}
    found: set[int] | None = None
    for child in calls:
        parent = by_id.get(child.parent_id or "")
        if parent is None or parent.prompt_ids is None or child.prompt_ids is None:
            continue
        if parent.messages is None or child.messages is None:
            continue
        m_before, added = len(parent.messages), len(child.messages) - len(parent.messages)
        before, after = Counter(parent.prompt_ids), Counter(child.prompt_ids)
        pair = {t for t, n in before.items() if n in (m_before, m_before + 1) and after[t] - n == added}
        found = pair if found is None else found & pair
    # The model ends its turn with that token, never samples it mid-turn.
    inside = {t for c in calls for ch in c.choices for t in (ch.get("token_ids") or [])[:-1]}
    return frozenset((found or set()) - inside)


def _differing(span: Sequence[int], sampled: Sequence[int]) -> int:
    return sum(a != b for a, b in zip(span, sampled, strict=False)) + abs(len(span) - len(sampled))


def locate_turn_end(
    prompt: Sequence[int],
    sampled: Sequence[int],
    next_prompt: Sequence[int],
    *,
    rendered: Sequence[int] | None = None,
    end_of_turn: Collection[int] = (),
) -> tuple[int | None, int]:
    """Where the re-rendered assistant turn ends in ``next_prompt``, and how many tokens differ.

    Differences are counted by position, plus the difference in length.

    Returns ``(None, len(sampled))`` when no method finds it. A template-added
    end-of-turn token that the model did not sample (a truncated turn) stays
    outside the span, as it does when the sampled ids match exactly.
    """
    start = len(prompt)
    if list(next_prompt[start : start + len(sampled)]) == list(sampled):
        return start + len(sampled), 0
    if rendered and list(next_prompt[start : start + len(rendered)]) == list(rendered):
        end = start + len(rendered)
        if end_of_turn and next_prompt[end - 1] in end_of_turn and sampled[-1:] != [next_prompt[end - 1]]:
            end -= 1
        return end, _differing(next_prompt[start:end], sampled)
    # Each candidate token ends the span at its first occurrence; the span closest to
    # what was sampled wins (a content token that passed inference by chance loses).
    best: tuple[int, int, int] | None = None
    for token in end_of_turn:
        at = next((i + 1 for i in range(start, len(next_prompt)) if next_prompt[i] == token), None)
        if at is None:
            continue
        if sampled[-1:] != [token]:
            at -= 1  # the model did not sample the end token: it stays outside, as in an exact match
        found = (abs(at - start - len(sampled)), _differing(next_prompt[start:at], sampled), at)
        best = found if best is None or found < best else best
    if best is None:
        return None, len(sampled)
    return best[2], best[1]
