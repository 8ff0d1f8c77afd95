"""The support family's simulated customer: what they say about an episode, in words and never a number.

The customer reacts to the first thing that went wrong, in the order a customer would notice it
(:func:`customer_verdict`: no lookup, the wrong order, no answer, the wrong status, a missing detail,
no apology, no name, too long, or good), in one of a few phrasings chosen from a seed
(:func:`customer_says`). :class:`examples.support_harness.SupportHarness` posts it as a comment on the
episode (``comment``, feedback without a value), or sends it as the next turn of the same conversation
(``reply``), which the proxy reads as implicit feedback when the project turns ``implicit_feedback`` on.
Held-out episodes are graded numerically, as arithmetic's are.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Literal

from examples.support import STATUS_WORDS, Check, Status, SupportProblem, failed_checks

Verdict = Literal[
    "no_lookup",
    "wrong_order",
    "no_answer",
    "no_status",
    "wrong_status",
    "no_detail",
    "no_apology",
    "no_name",
    "too_long",
    "good",
]
PHRASES: dict[Verdict, tuple[str, ...]] = {
    "no_lookup": ("Did you even look my order up?", "You did not check my order at all."),
    "wrong_order": ("That is not my order.", "You looked up the wrong order."),
    "no_answer": ("I never got an answer.", "Hello? You did not answer me."),
    "no_status": ("You did not tell me where my order is.", "So what is happening with my order?"),
    "wrong_status": ("That is not what my order's status is.", "That is wrong, my order is not in that state."),
    "no_detail": (
        "Fine, but you did not tell me what I actually need to know.",
        "And? You left out the important part.",
    ),
    "no_apology": ("A delay, and not even a sorry?", "You could at least apologise for the delay."),
    "no_name": ("You could use my name, you know.", "A bit impersonal: you did not even greet me by name."),
    "too_long": ("Right, but that took a while.", "Correct, though it took far too long."),
    "good": ("Thanks, that is all I needed!", "Great, thank you."),
}
_DETAIL: dict[Status, tuple[str, ...]] = {
    "shipped": ("But when will it arrive?", "You did not say when it arrives."),
    "delayed": ("So when will it come now?", "Delayed until when?"),
    "delivered": ("When was it delivered, then?", "You did not say when it was delivered."),
    "processing": ("When will it ship?", "You did not tell me when it ships."),
    "cancelled": ("And what about my refund?", "How much will I get back?"),
}


def customer_verdict(
    problem: SupportProblem, looked_up: Sequence[str], answer: str | None, correct: bool, brevity: float
) -> Verdict:
    """What the customer reacts to: the first thing that went wrong, in the order a customer would notice."""
    if not looked_up:
        return "no_lookup"
    if problem.order_id not in looked_up:
        return "wrong_order"
    if correct:
        return "good" if brevity >= 1.0 else "too_long"
    failed = failed_checks(problem.order, answer)
    first: dict[Check, Verdict] = {
        "answered": "no_answer",
        "order": "wrong_order",
        "status": "wrong_status",
        "detail": "no_detail",
        "apology": "no_apology",
        "name": "no_name",
    }
    if failed[0] == "status" and not any(
        re.search(rf"\b{re.escape(w)}\b", (answer or "").lower()) for words in STATUS_WORDS.values() for w in words
    ):
        return "no_status"  # no status word at all: nothing said, rather than something wrong
    return first[failed[0]]


def customer_says(
    problem: SupportProblem, looked_up: Sequence[str], answer: str | None, correct: bool, brevity: float, seed: str
) -> str:
    """One phrasing of the customer's reaction, chosen from ``seed``; never a digit."""
    verdict = customer_verdict(problem, looked_up, answer, correct, brevity)
    rng = random.Random(seed)
    phrases = _DETAIL[problem.order.status] if verdict == "no_detail" else PHRASES[verdict]
    text = rng.choice(phrases)
    assert not re.search(r"\d", text), text  # the phrases are fixed; this guards edits to them
    return text
