"""The user's next message as feedback on the answer before it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from storage.hindsight import next_turn_feedback
from tests.storage.rows import choice, row

Q = {"role": "user", "content": "I had 9 apples and gave away 4. How many are left?"}
A1 = {"role": "assistant", "content": "ANSWER: 13"}


def call(cid: str, messages: list[dict[str, Any]], reply: str, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(**row(cid, [1], [choice([5, 2], content=reply)], messages=messages, **kw))


def test_the_next_user_message_is_hindsight_on_the_previous_answer() -> None:
    first = call("c1", [Q], "ANSWER: 13")
    second = call(
        "c2", [Q, A1, {"role": "user", "content": "That's wrong: I gave them away."}], "ANSWER: 5", parent="c1", at=1
    )
    (h,) = next_turn_feedback([first, second])
    assert (h.completion_id, h.text, h.by_completion_id) == ("c1", "That's wrong: I gave them away.", "c2")


def test_found_without_a_parent_link_and_never_from_tool_results() -> None:
    first = call("c1", [Q], "ANSWER: 13")
    linked_by_prefix = call("c2", [Q, A1, {"role": "user", "content": "no"}], "ok", at=1)
    assert [h.completion_id for h in next_turn_feedback([first, linked_by_prefix])] == ["c1"]
    tool = call("c3", [Q, A1, {"role": "tool", "content": "13", "tool_call_id": "x"}], "ANSWER: 13", at=1)
    other_prompt = call("c4", [{"role": "user", "content": "something else"}], "hi", at=2)
    assert next_turn_feedback([first, tool, other_prompt]) == []
    other_session = call("c5", [Q, A1, {"role": "user", "content": "no"}], "ok", at=1, session="s2")
    assert next_turn_feedback([first, other_session]) == []


def test_a_tool_output_in_a_text_protocol_is_no_feedback_when_the_project_names_its_prefix() -> None:
    calc = {"role": "assistant", "content": "CALC: 9 - 4"}
    first = call("c1", [Q], "CALC: 9 - 4")
    result = call("c2", [Q, calc, {"role": "user", "content": "  RESULT: 5"}], "ANSWER: 5", parent="c1", at=1)
    assert [h.text for h in next_turn_feedback([first, result])] == ["RESULT: 5"]  # a user message, read as one
    assert next_turn_feedback([first, result], skip=("RESULT:",)) == []
    reply = call("c3", [Q, calc, {"role": "user", "content": "Why a calculator?"}], "ANSWER: 5", parent="c1", at=1)
    assert [h.text for h in next_turn_feedback([first, reply], skip=("RESULT:",))] == ["Why a calculator?"]
