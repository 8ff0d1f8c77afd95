"""The demo's text arms: verdict-true comments with no numbers, corrections, and silence."""

from __future__ import annotations

import re

import pytest

from examples.episodes import run_episodes
from examples.feedback import PHRASES, comment, correction, verdict
from examples.task import Problem, make_problems
from tests.examples.test_harness import FakeModel, FeedbackSink, harness, multiplication, solver

STICKERS = Problem("p1", "stickers", "Tom had 900 stickers and gave away 300. How many stickers are left?", 600)


@pytest.mark.parametrize(
    ("answer", "correct", "brevity", "expected"),
    [
        (600, True, 1.0, "correct_brief"),
        (600, True, 0.5, "too_long"),
        (1200, False, 0.0, "wrong_operation"),  # 900 + 300
        (270000, False, 0.0, "wrong_operation"),  # 900 * 300
        (650, False, 0.0, "too_large"),
        (10, False, 0.0, "too_small"),
        (None, False, 0.0, "no_answer"),
    ],
)
def test_verdicts(answer: float | None, correct: bool, brevity: float, expected: str) -> None:
    assert verdict(STICKERS, answer, correct, brevity) == expected


def test_at_least_five_phrasings_per_verdict_none_with_a_number() -> None:
    for phrases in PHRASES.values():
        assert len(set(phrases)) >= 5
        assert not any(re.search(r"\d", p) for p in phrases)
    chosen = {comment(STICKERS, 650, False, 0.0, seed=f"s{i}") for i in range(60)}
    assert chosen == set(PHRASES["too_large"])  # chosen at random, reproducibly by session
    assert comment(STICKERS, 650, False, 0.0, seed="s1") == comment(STICKERS, 650, False, 0.0, seed="s1")


def test_comments_arm_grades_every_episode_with_a_comment_and_no_score() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    problems = [p for p in make_problems("train", 80) if p.template in ("boxes", "stickers")][:6]
    with harness(model, sink, feedback="comments") as h:
        results = run_episodes(h, problems, attempts=2, workers=2, progress=False)
        heldout = run_episodes(h, problems[:2], eval=True, progress=False)
    train_items = sink.items[: len(results)]
    assert len(train_items) == len(results) and all(r.feedback == ["review"] for r in results)
    for item, r in zip(
        sorted(train_items, key=lambda i: i["id"]), sorted(results, key=lambda r: r.session_id + ":"), strict=True
    ):
        assert "value" not in item and item["target"] == {"session_id": r.session_id}
        assert not re.search(r"\d", item["comment"])
    graded = sink.items[len(results) :]
    assert [i["name"] for i in graded] == ["reward"] * len(heldout)  # held-out: still numeric, and a comment
    assert all(isinstance(i["value"], float) and i["comment"] and not re.search(r"\d", i["comment"]) for i in graded)


def test_corrections_arm_posts_the_right_answer_line_on_the_last_call() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    (problem,) = multiplication()
    with harness(model, sink, feedback="corrections") as h:
        r = h.episode(problem, session_id="s-1")
    (item,) = sink.items
    assert item["name"] == "correction" and item["comment"] == correction(problem) == f"ANSWER: {problem.answer}"
    assert item["target"] == {"completion_id": r.completion_ids[-1]} and "value" not in item


def test_corrections_of_the_first_call_post_its_calculator_line() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    (problem,) = multiplication()
    with harness(model, sink, feedback="corrections", correct="first") as h:
        r = h.episode(problem, session_id="s-1")
    (item,) = sink.items
    assert item["comment"] == correction(problem, "first") == f"CALC: {problem.expression}"
    match = re.fullmatch(r"(\d+)\*(\d+)", problem.expression)  # the operation the question asks for
    assert match is not None and int(match[1]) * int(match[2]) == problem.answer
    assert len(r.completion_ids) > 1 and item["target"] == {"completion_id": r.completion_ids[0]}


def test_none_arm_posts_nothing_for_training_traffic() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    with harness(model, sink, feedback="none") as h:
        run_episodes(h, multiplication(3), progress=False)
        run_episodes(h, multiplication(1), eval=True, progress=False)
    assert [i["name"] for i in sink.items] == ["reward"]
