"""What a reviewer says instead of a score: the demo's comment and correction arms.

A comment says what went wrong or right (wrong operation, result too large or
too small, too long, no answer, correct and brief), in one of several phrasings
per verdict chosen at random (seeded by the session, so a run is reproducible),
and never contains the answer or any number: the learning signal has to come
from the words. A correction is the line the answer should have been: the final
``ANSWER:`` line on the session's last call (the issue's arm), or, with ``first``, the
``CALC:`` line on its first call, where a wrong operation goes wrong.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Literal

from examples.task import Problem

CorrectedTurn = Literal["last", "first"]
Verdict = Literal["correct_brief", "too_long", "wrong_operation", "too_large", "too_small", "no_answer"]

PHRASES: dict[Verdict, tuple[str, ...]] = {
    "correct_brief": (
        "Correct and brief, exactly what I needed.",
        "Right answer, short and clean.",
        "Spot on, and to the point.",
        "That is correct, and nicely concise.",
        "Good: the right result with no extra steps.",
    ),
    "too_long": (
        "The result is right, but it took far too many steps.",
        "Correct in the end, though much too long-winded.",
        "Right answer, but way too verbose: one calculation and the answer would do.",
        "You got there, but with a lot of unnecessary turns.",
        "Correct, yet far longer than it needed to be.",
    ),
    "wrong_operation": (
        "Wrong operation: read again what the question asks you to do with the numbers.",
        "You combined the numbers the wrong way; the wording calls for a different operation.",
        "That is not the operation this problem needs.",
        "The calculation used the wrong operator for this situation.",
        "Wrong kind of calculation: think about whether things are added, taken away, grouped or shared.",
    ),
    "too_large": (
        "Wrong: the result is far too large.",
        "That answer is too big; the real one is smaller.",
        "Incorrect, the number you gave overshoots.",
        "Too high. Check the calculation.",
        "Wrong answer, it should be a smaller number.",
    ),
    "too_small": (
        "Wrong: the result is too small.",
        "That answer is too low; the real one is bigger.",
        "Incorrect, the number you gave falls short.",
        "Too small. Check the calculation.",
        "Wrong answer, it should be a larger number.",
    ),
    "no_answer": (
        "No final answer was given.",
        "It never got to an answer.",
        "I did not get an answer at all.",
        "The reply stopped without an answer line.",
        "Missing answer: finish with the result.",
    ),
}

_OPS: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


def _numbers(question: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", question)]


def verdict(problem: Problem, answer: float | None, correct: bool, brevity: float) -> Verdict:
    """The reviewer's verdict on one episode."""
    if answer is None:
        return "no_answer"
    if correct:
        return "correct_brief" if brevity >= 1.0 else "too_long"
    nums = _numbers(problem.question)
    if len(nums) == 2:
        a, b = nums
        others = {f(x, y) for f in _OPS.values() for x, y in ((a, b), (b, a)) if y != 0}
        if any(abs(answer - v) < 1e-9 for v in others if abs(v - problem.answer) > 1e-9):
            return "wrong_operation"
    return "too_large" if answer > problem.answer else "too_small"


def comment(problem: Problem, answer: float | None, correct: bool, brevity: float, seed: str) -> str:
    """One phrasing of the verdict, chosen at random from ``seed``; no digit ever appears in it."""
    text = random.Random(seed).choice(PHRASES[verdict(problem, answer, correct, brevity)])
    assert not re.search(r"\d", text), text  # the phrases are fixed; this guards edits to them
    return text


def correction(problem: Problem, turn: CorrectedTurn = "last") -> str:
    """The line the answer should have been: the final answer (``last``), or the calculator call (``first``)."""
    return f"ANSWER: {problem.answer}" if turn == "last" else f"CALC: {problem.expression}"
