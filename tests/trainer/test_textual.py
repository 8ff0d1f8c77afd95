"""Text feedback → SDPO and correction examples, from stored rows only (renders are stand-ins for the template)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from storage.grading import to_grade
from storage.hindsight import next_turn_feedback
from tests.storage.rows import choice, feedback_row, row
from trainer.sdpo import CORRECTION_SAME, HINT_TEMPLATE
from trainer.textual import CORRECTION_HINT, Hint, TextualExample, build_examples, hints

Q = {"role": "user", "content": "I had 9 apples and gave away 4. How many are left?"}
PROMPT = [1, 10, 3, 40, 2, 3, 1, 12, 3]


def prompt_render(messages: list[dict[str, Any]]) -> list[int]:
    """One token per message (its length mod 90, + 100), then the generation prompt: enough to tell contexts apart."""
    return [100 + len(str(m.get("content"))) % 90 for m in messages] + [1, 12, 3]


def turn_render(before: list[dict[str, Any]], assistant: dict[str, Any]) -> list[int]:
    return [200 + ord(ch) % 50 for ch in str(assistant["content"])] + [2]


def call(cid: str, messages: list[dict[str, Any]], reply: str, ids: Sequence[int], **kw: Any) -> SimpleNamespace:
    lps = [-0.25 * (i + 1) for i in range(len(ids))]
    return SimpleNamespace(
        **row(cid, PROMPT, [choice(list(ids), content=reply, logprobs=lps)], messages=messages, project="p", **kw)
    )


def _by(examples: list[TextualExample], objective: str) -> list[TextualExample]:
    return [e for e in examples if e.objective == objective]


def test_a_comment_becomes_an_sdpo_example_on_the_sessions_last_call() -> None:
    first = call("c1", [Q], "ANSWER: 13", [50, 51, 2])
    grades = [
        to_grade(feedback_row("p", "review", comment="Wrong operation.", session="s1", source="customer")),
        to_grade(feedback_row("p", "reward", 0.2, comment="judge reasoning", session="s1", source="judge")),
    ]
    items = hints([first], grades)
    assert [(h.completion_id, h.kind, h.text) for h in items] == [("c1", "comment", "Wrong operation.")]
    examples, excluded = build_examples([first], items, prompt_render, turn_render)
    (ex,) = examples
    assert ex.objective == "sdpo" and not excluded
    assert ex.student.token_ids == PROMPT + [50, 51, 2]  # the recorded ids, never re-tokenized
    assert ex.student.mask == [0] * 9 + [1, 1, 1] and ex.student.logprobs[9:] == [-0.25, -0.5, -0.75]
    teacher_prompt = prompt_render([Q, {"role": "user", "content": HINT_TEMPLATE.format(feedback="Wrong operation.")}])
    assert ex.teacher is not None and ex.teacher.token_ids == teacher_prompt + [50, 51, 2]
    assert ex.teacher.mask[-3:] == [1, 1, 1] and sum(ex.teacher.mask) == 3
    assert ex.key == ("c1:0", items[0].feedback_id, "sdpo")
    # Keyed per (trajectory, feedback item, objective): used already, it is counted and left out.
    again, excluded = build_examples([first], items, prompt_render, turn_render, used={ex.key})
    assert again == [] and excluded == {"already_used": 1}


def test_a_correction_gives_sft_on_the_corrected_text_and_an_sdpo_hint() -> None:
    first = call("c1", [Q], "ANSWER: 13", [50, 51, 2])
    correction = Hint("c1", "fb-1", "correction", "ANSWER: 5")
    examples, excluded = build_examples([first], [correction], prompt_render, turn_render)
    (sdpo,), (sft,) = _by(examples, "sdpo"), _by(examples, "correction")
    shown = HINT_TEMPLATE.format(feedback=CORRECTION_HINT.format(correction="ANSWER: 5"))
    assert sdpo.teacher is not None
    assert sdpo.teacher.token_ids[:-3] == prompt_render([Q, {"role": "user", "content": shown}])
    corrected = turn_render([Q], {"role": "assistant", "content": "ANSWER: 5"})
    assert sft.student.token_ids == PROMPT + corrected and sft.student.mask == [0] * 9 + [1] * len(corrected)
    same = Hint("c1", "fb-2", "correction", " ANSWER:  13 ")
    examples, excluded = build_examples([first], [same], prompt_render, turn_render)
    assert [e.objective for e in examples] == ["sdpo"] and excluded == {CORRECTION_SAME: 1}


def test_what_cannot_become_an_example_is_counted() -> None:
    rows = [
        call("held", [Q], "x", [5], tags=["eval"]),
        call("judge", [Q], "x", [5], tags=["judge"]),
        call("noids", [Q], "x", []),
        SimpleNamespace(**{**vars(call("notext", [Q], "x", [5])), "request": {"model": "m"}}),
        call("long", [Q], "x", [5] * 50),
    ]
    items = [Hint(r.id, f"f-{r.id}", "comment", "too long") for r in rows]
    examples, excluded = build_examples(rows, items, prompt_render, turn_render, max_len=40)
    assert examples == []
    assert excluded == {"eval": 1, "judge_call": 1, "no_token_ids": 1, "no_text": 1, "too_long": 1}


def test_implicit_feedback_in_a_multi_turn_session_yields_an_sdpo_example_for_turn_one() -> None:
    """The user's second message says the first answer was wrong: turn 1 gets an SDPO example with it as the hint."""
    a1 = {"role": "assistant", "content": "ANSWER: 13"}
    complaint = "That's wrong, I gave 4 away, so it is fewer than 9."
    turn1 = call("t1", [Q], "ANSWER: 13", [50, 51, 2])
    turn2 = call("t2", [Q, a1, {"role": "user", "content": complaint}], "ANSWER: 5", [52, 2], parent="t1", at=1)
    items = hints([turn1, turn2], [], next_turn_feedback([turn1, turn2]))
    assert [(h.completion_id, h.kind, h.text) for h in items] == [("t1", "implicit", complaint)]
    (ex,), excluded = build_examples([turn1, turn2], items, prompt_render, turn_render)
    assert not excluded and ex.objective == "sdpo" and ex.student.completion_ids == ["t1"]
    assert ex.student.token_ids[-3:] == [50, 51, 2]  # turn 1's own sampled ids
    assert ex.teacher is not None
    assert ex.teacher.token_ids[:-3] == prompt_render(
        [Q, {"role": "user", "content": HINT_TEMPLATE.format(feedback=complaint)}]
    )
    assert ex.key == ("t1:0", "implicit:t2", "sdpo")
