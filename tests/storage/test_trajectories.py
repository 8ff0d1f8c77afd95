"""Trajectory assembly on hand-built rows with hand-computed answers (see rows.py for the vocabulary)."""

from __future__ import annotations

from typing import Any

from storage.alignment import infer_end_of_turn, locate_turn_end
from storage.trajectories import assemble, assemble_session, chat_template_render, to_call, trajectory_to_dict
from tests.storage.rows import GEN, NL, choice, msg, row

USER = {"role": "user", "content": "hi"}
TOOL = {"role": "tool", "content": "42", "tool_call_id": "t1"}
P1 = msg("user", 40) + GEN  # 9 tokens
AFTER = [NL, *msg("tool", 60), *GEN]  # what follows the assistant turn's end token in the next prompt
S2 = [52, 2]


def two_turns(first_rendered: list[int], s1: list[int], *, finish: str = "stop", **second: Any) -> list[dict[str, Any]]:
    """Call 1 samples s1; call 2's prompt re-renders it as ``first_rendered`` and adds a tool result."""
    c1 = row("c1", P1, [choice(s1, finish=finish, logprobs=[-0.1 * (i + 1) for i in range(len(s1))])])
    reply = {"role": "assistant", "content": "x"}
    c2 = row("c2", P1 + first_rendered + AFTER, [choice(S2)], messages=[USER, reply, TOOL], parent="c1", at=1)
    c2.update(second)
    return [c1, c2]


def test_exact_rerender_masks_sampled_tokens_and_keeps_tool_results_as_context() -> None:
    [t] = assemble_session(two_turns([50, 51, 2], [50, 51, 2]))
    suffix = [3, 1, 13, 3, 60, 2, 3, 1, 12, 3]
    assert t.token_ids == P1 + [50, 51, 2] + suffix + S2
    assert t.mask == [0] * 9 + [1] * 3 + [0] * 10 + [1] * 2
    assert t.logprobs == [None] * 9 + [-0.1, -0.2, -0.30000000000000004] + [None] * 10 + [-0.5, -0.5]
    assert [(u.completion_id, u.start, u.end) for u in t.turns] == [("c1", 9, 12), ("c2", 22, 24)]
    assert (t.mismatches, t.flags, t.id, t.completion_ids) == (0, [], "c2:0", ["c1", "c2"])
    assert t.turns[0].sampling["temperature"] == 1.0 and t.adapters == [None, None]


def test_rerender_mismatch_keeps_sampled_ids_and_counts_the_difference() -> None:
    # The template gave back [50, 70, 71, <end>] for the sampled [50, 51, <end>]: the end
    # token is inferred from the prompts (<start> and <end> grow by the 2 added messages).
    rows = two_turns([50, 70, 71, 2], [50, 51, 2])
    assert infer_end_of_turn([to_call(r) for r in rows]) == {1, 2}
    [t] = assemble_session(rows)
    assert t.token_ids == P1 + [50, 51, 2] + [3, 1, 13, 3, 60, 2, 3, 1, 12, 3] + S2
    assert t.mask == [0] * 9 + [1] * 3 + [0] * 10 + [1] * 2
    assert t.mismatches == 3  # 70≠51, 71≠2, one token longer
    assert t.flags == ["rerender_mismatch"]


def test_truncated_turn_leaves_the_template_end_token_unmasked() -> None:
    [t] = assemble_session(two_turns([50, 51, 2], [50, 51], finish="length"))
    assert t.token_ids == P1 + [50, 51] + [2, 3, 1, 13, 3, 60, 2, 3, 1, 12, 3] + S2
    assert t.mask == [0] * 9 + [1, 1] + [0] * 11 + [1, 1]
    assert (t.mismatches, t.flags) == (0, ["truncated"])


def test_truncated_and_rerendered_turn_found_by_the_end_token() -> None:
    [t] = assemble_session(two_turns([50, 51, 77, 2], [50, 51, 99], finish="length"))
    assert t.token_ids == P1 + [50, 51, 99] + [2, 3, 1, 13, 3, 60, 2, 3, 1, 12, 3] + S2
    assert t.mismatches == 1
    assert t.flags == ["truncated", "rerender_mismatch"]


def test_render_callable_locates_the_turn_when_nothing_else_can() -> None:
    rows = two_turns([50, 70, 71, 2], [50, 51, 2])
    rows[1]["request"] = {}  # no messages: no end token can be inferred
    [unaligned] = assemble_session(rows)
    assert "unaligned" in unaligned.flags
    seen: list[Any] = []

    def render(before: list[dict[str, Any]], assistant: dict[str, Any]) -> list[int]:
        seen.append((before, assistant))
        return [50, 70, 71, 2]

    [t] = assemble_session(rows, render=render)
    assert seen == [([USER], {"role": "assistant", "content": ""})]
    assert t.token_ids == P1 + [50, 51, 2] + [3, 1, 13, 3, 60, 2, 3, 1, 12, 3] + S2
    assert (t.mismatches, t.flags) == (3, ["rerender_mismatch"])
    [given] = assemble_session(rows, end_of_turn={2})
    assert given.token_ids == t.token_ids


def test_locate_turn_end_directly() -> None:
    assert locate_turn_end([9], [5, 2], [9, 5, 2, 3]) == (3, 0)
    assert locate_turn_end([9], [5, 2], [9, 6, 2, 3], end_of_turn={2}) == (3, 1)
    assert locate_turn_end([9], [5], [9, 6, 2, 3], end_of_turn={2}) == (2, 1)  # <end> not sampled: outside
    assert locate_turn_end([9], [5, 2], [9, 6, 2, 3]) == (None, 2)
    # Two candidate end tokens: the span closest in length to the sampled turn wins.
    assert locate_turn_end([9], [5, 6, 2], [9, 5, 7, 6, 2, 3], end_of_turn={7, 2}) == (5, 3)
    assert locate_turn_end([9], [5, 6, 2], [9, 5, 8, 2, 3], rendered=[5, 8, 2]) == (4, 1)


def test_retries_and_new_prompts_become_separate_trajectories() -> None:
    c1 = row("c1", P1, [choice([50, 2])], task="t")
    nxt = P1 + [50, 2] + AFTER
    c2 = row("c2", nxt, [choice([52, 2])], messages=[USER, {}, TOOL], parent="c1", at=1, task="t")
    c3 = row("c3", nxt, [choice([53, 2])], messages=[USER, {}, TOOL], parent="c1", at=2, task="t")  # a retry
    c4 = row("c4", msg("user", 41) + GEN, [choice([54, 2])], at=3, task="t")  # does not extend anything
    ts = assemble_session([c4, c3, c2, c1])
    assert [t.completion_ids for t in ts] == [["c1", "c2"], ["c1", "c3"], ["c4"]]
    assert [t.id for t in ts] == ["c2:0", "c3:0", "c4:0"]
    assert ts[1].token_ids == P1 + [50, 2] + AFTER + [53, 2]
    assert {t.group for t in ts} == {"t"}


def test_a_failed_call_beside_its_retry_is_no_branch() -> None:
    c1 = row("c1", P1, [choice([50, 2])])
    nxt = P1 + [50, 2] + AFTER
    failed = row("c2", nxt, [], messages=[USER, {}, TOOL], parent="c1", at=1, termination="upstream_error")
    retry = row("c3", nxt, [choice([53, 2])], messages=[USER, {}, TOOL], parent="c1", at=2)
    assert [t.completion_ids for t in assemble_session([c1, failed, retry])] == [["c1", "c3"]]
    [last] = assemble_session([c1, failed])  # nothing continued: the failure ends the episode
    assert (last.completion_ids, last.flags, last.token_ids) == (["c1", "c2"], ["upstream_error"], nxt)


def test_n_choices_are_a_group_and_the_child_follows_the_choice_it_extends() -> None:
    c1 = row("c1", P1, [choice([50, 2], content="a"), choice([51, 2], index=1, content="b")])
    c1["sampling"]["n"] = 2
    user2 = {"role": "user", "content": "more"}
    q2 = P1 + [51, 2] + [NL, *msg("user", 41), *GEN]
    c2 = row("c2", q2, [choice(S2)], messages=[USER, {"role": "assistant", "content": "b"}, user2], parent="c1", at=1)
    first, second = assemble_session([c1, c2])
    assert (first.id, first.completion_ids, first.token_ids) == ("c1:0", ["c1"], P1 + [50, 2])
    assert (second.id, second.completion_ids) == ("c2:0", ["c1", "c2"])
    assert second.token_ids == P1 + [51, 2] + [3, 1, 10, 3, 41, 2, 3, 1, 12, 3] + S2
    assert second.turns[0].choice_index == 1
    assert first.group == second.group == "c1"


def test_incomplete_capture_is_flagged_with_the_reason() -> None:
    no_lps = row("a1", P1, [choice([50, 2], logprobs=None)], session="a", tags=["eval"])
    [t] = assemble_session([no_lps])
    assert t.flags == ["missing_logprobs"] and t.logprobs == [None] * 11 and t.mask[-2:] == [1, 1]
    assert t.tags == ["eval"]
    no_ids = row("b1", None, [choice([50, 2])], session="b")
    assert assemble_session([no_ids])[0].flags == ["missing_token_ids"]
    cut = row("c1", P1, [choice([50], finish="length")], session="c", termination="client_disconnected")
    assert assemble_session([cut])[0].flags == ["client_disconnected", "truncated"]
    failed = row("d1", P1, [], session="d", termination="upstream_error")
    [f] = assemble_session([failed])
    assert (f.flags, f.turns, f.token_ids, f.id) == (["upstream_error"], [], P1, "d1:0")
    orphan = row("e2", P1, [choice([50, 2])], session="e", parent="e1")
    assert assemble_session([orphan])[0].flags == ["missing_parent"]


def test_assemble_splits_by_session_and_serialises() -> None:
    rows = [row("a1", P1, [choice([50, 2])], session="a", adapter=3), row("b1", P1, [choice([51, 2])], session="b")]
    ts = assemble(rows)
    assert [(t.session_id, t.adapters) for t in ts] == [("a", [3]), ("b", [None])]
    out = trajectory_to_dict(ts[0])
    assert out["adapters"] == [3] and out["turns"][0]["served_model"] == "agent@v3"


def test_chat_template_render_on_the_tiny_tokenizer() -> None:
    from transformers import AutoTokenizer

    from engine.weights import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("tiny").path)
    render = chat_template_render(tok)
    ids = render([{"role": "user", "content": "hi"}], {"role": "assistant", "content": "yo"})
    assert ids == [*tok.encode("yo", add_special_tokens=False), tok.eos_token_id]
