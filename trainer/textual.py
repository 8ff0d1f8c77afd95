"""From stored records to text-feedback examples: self-distillation (SDPO) and corrections (filtered SFT).

One feedback item with text becomes training signal on one logged call:

* a **comment** (any feedback with a comment, from any source but the judge),
  session-level ones on the session's last call: an SDPO example, the comment
  as the teacher's hint;
* a **correction** (feedback named ``correction``, the corrected answer in its
  comment): an SFT example (the corrected text as the assistant turn under the
  call's own recorded prompt ids) and an SDPO example (the correction shown to
  the teacher as a better answer);
* **implicit** feedback (:mod:`storage.hindsight`, when the project turns it on):
  an SDPO example, the user's next message as the hint.

Only stored records are read. The student's tokens are the recorded prompt ids
and sampled ids (never re-tokenized); the teacher's prompt is the chat template
applied to :func:`trainer.sdpo.teacher_messages`, followed by the same sampled
ids. Each example is keyed by (trajectory, feedback item, objective), so a
comment arriving after the call was trained on numerically still yields one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from storage.grading import JUDGE_SOURCE, JUDGE_TAG, Exclusion, Grade, current
from storage.hindsight import Hindsight
from storage.trajectories import Render, Trajectory, Turn, trajectory_id
from trainer.sdpo import correction_exclusion, teacher_messages, teacher_sequence

CORRECTION = "correction"  # the feedback name of a correction
CORRECTION_HINT = "A better answer would have been:\n{correction}"
Kind = Literal["comment", "correction", "implicit"]
Objective = Literal["sdpo", "correction"]
PromptRender = Callable[[list[dict[str, Any]]], list[int]]  # messages → ids, ending in the generation prompt

# Exclusion reasons (counted like every other).
NO_TOKEN_IDS = "no_token_ids"
NO_TEXT = "no_text"
HELD_OUT = Exclusion.EVAL
JUDGE_CALL = "judge_call"
TOO_LONG = Exclusion.TOO_LONG
UNRENDERABLE = "correction_unrenderable"
ALREADY_USED = Exclusion.ALREADY_USED


@dataclass(frozen=True)
class Hint:
    """Text feedback about one call's answer."""

    completion_id: str
    feedback_id: str
    kind: Kind
    text: str


@dataclass
class TextualExample:
    """One text-feedback training example; ``teacher`` only for SDPO."""

    objective: Objective
    hint: Hint
    student: Trajectory
    teacher: Trajectory | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """What "used" means for text feedback: (trajectory, feedback item, objective)."""
        return (self.student.id, self.hint.feedback_id, self.objective)


def hints(calls: Sequence[Any], grades: Iterable[Grade], hindsight: Iterable[Hindsight] = ()) -> list[Hint]:
    """Comments and corrections (current items, not the judge's) and hindsight, each on one call."""
    last: dict[str, str] = {}
    for c in calls:  # in time order: the last call answers for the session
        last[c.session_id] = c.id
    out: list[Hint] = []
    for g in current(grades):
        text = (g.comment or "").strip()
        if not text or g.source == JUDGE_SOURCE:
            continue
        target = g.completion_id or (last.get(g.session_id) if g.session_id else None)
        if target is not None:
            out.append(Hint(target, g.id, "correction" if g.name == CORRECTION else "comment", text))
    for h in hindsight:
        out.append(Hint(h.completion_id, f"implicit:{h.by_completion_id}", "implicit", h.text))
    return out


def _sampled(call: Any) -> tuple[list[int], list[float | None], dict[str, Any]] | None:
    first = (call.choices or [{}])[0] or {}
    ids = first.get("token_ids")
    if not call.prompt_token_ids or not ids:
        return None
    lps = first.get("logprobs") or []
    logprobs = [lp if isinstance(lp, int | float) and math.isfinite(lp) else None for lp in lps]
    logprobs += [None] * (len(ids) - len(logprobs))
    return list(ids), logprobs[: len(ids)], dict(call.sampling or {})


def _trajectory(
    call: Any, prompt: list[int], sampled: list[int], logprobs: list[float | None], sampling: dict[str, Any]
) -> Trajectory:
    start = len(prompt)
    head: list[float | None] = [None] * start
    turn = Turn(call.id, 0, start, start + len(sampled), call.adapter_version, call.served_model, sampling)
    return Trajectory(
        id=trajectory_id(call.id, 0),
        project_id=call.project_id,
        session_id=call.session_id,
        task_id=call.task_id,
        alias=call.alias,
        token_ids=prompt + sampled,
        mask=[0] * start + [1] * len(sampled),
        logprobs=head + logprobs,
        turns=[turn],
        completion_ids=[call.id],
        tags=[str(t) for t in call.tags or ()],
    )


def build_examples(
    calls: Sequence[Any],
    items: Iterable[Hint],
    prompt_render: PromptRender,
    turn_render: Render,
    *,
    max_len: int = 2048,
    used: Collection[tuple[str, str, str]] = (),
) -> tuple[list[TextualExample], Counter[str]]:
    """SDPO and correction examples for the hints, and every hint left out counted by reason."""
    by_id = {c.id: c for c in calls}
    out: list[TextualExample] = []
    excluded: Counter[str] = Counter()
    for hint in items:
        call = by_id.get(hint.completion_id)
        if call is None:
            continue
        reason, made = _examples(call, hint, prompt_render, turn_render, max_len)
        if reason:
            excluded[reason] += 1
        for example in made:
            if example.key in used:
                excluded[ALREADY_USED] += 1
            else:
                out.append(example)
    return out, excluded


def _examples(
    call: Any, hint: Hint, prompt_render: PromptRender, turn_render: Render, max_len: int
) -> tuple[str | None, list[TextualExample]]:
    tags = {str(t) for t in call.tags or ()}
    if "eval" in tags:
        return HELD_OUT, []
    if JUDGE_TAG in tags:
        return JUDGE_CALL, []
    sampled = _sampled(call)
    if sampled is None:
        return NO_TOKEN_IDS, []
    messages = (call.request or {}).get("messages")
    if not isinstance(messages, list):
        return NO_TEXT, []
    ids, logprobs, sampling = sampled
    prompt = list(call.prompt_token_ids)
    made: list[TextualExample] = []
    shown = CORRECTION_HINT.format(correction=hint.text) if hint.kind == "correction" else hint.text
    teacher_prompt = prompt_render(teacher_messages(messages, shown))
    teacher_ids, _ = teacher_sequence(teacher_prompt, ids)
    if max(len(teacher_ids), len(prompt) + len(ids)) > max_len:
        return TOO_LONG, []
    student = _trajectory(call, prompt, ids, logprobs, sampling)
    teacher = _trajectory(call, teacher_prompt, ids, [None] * len(ids), sampling)
    made.append(TextualExample("sdpo", hint, student, teacher))
    if hint.kind != "correction":
        return None, made
    first = (call.choices or [{}])[0] or {}
    answer = (first.get("message") or {}).get("content")
    reason = correction_exclusion(hint.text, answer if isinstance(answer, str) else None)
    if reason:
        return reason, made
    corrected = turn_render([dict(m) for m in messages], {"role": "assistant", "content": hint.text})
    if not corrected:
        return UNRENDERABLE, made
    if len(prompt) + len(corrected) > max_len:
        return TOO_LONG, made
    plain = {"temperature": 1.0}  # SFT scores the corrected text under the plain distribution
    sft = _trajectory(call, prompt, corrected, [None] * len(corrected), plain)
    made.append(TextualExample("correction", hint, sft))
    return None, made
