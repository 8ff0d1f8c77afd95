"""The demo's judges: what ``onthejob demo`` configures per feedback arm (``PUT /v1/admin/project``).

* ``comments``: the served model reads each comment (with the question and the last answer)
  and says one word, positive or negative; its probability of "positive" is the score
  (readout ``probability``). A 135M model never writes a ``Score: N`` line, but asked this way,
  after six worked examples, it ranks the demo's comments by what they say; the calibration
  gate (held-out sessions, graded and commented, never trained on) decides each round whether
  its grades count.
* ``none``: self-evaluation: the same readout on the question and the last answer alone,
  with worked examples of right and wrong answers (no reviews); whether a 135M model can tell
  a right product from a wrong one is what its calibration measures.

The worked examples are written for this page, in the item's own form; none of them is one of
the comment phrasings the harness uses (:data:`examples.feedback.PHRASES`), and none holds the
answer to a held-out problem.
"""

from __future__ import annotations

from typing import Any

JUDGE_RUBRIC = (
    "The task is an arithmetic question. A good answer ends with a line 'ANSWER: N' where N is the "
    "correct number, uses the calculator correctly if at all, and is brief. Wrong or missing answers score low."
)
COMMENT_RUBRIC = (
    "You classify reviews of an answer. Reply positive if the reviewer says the answer is right, "
    "negative if the reviewer says it is wrong or missing."
)
_Q = "Question: How many apples are in 12 boxes of 4 apples?\n"
COMMENT_EXAMPLES: tuple[tuple[str, bool], ...] = (
    (_Q + "Answer: ANSWER: 48\nReview: Perfect, well done.", True),
    (_Q + "Answer: ANSWER: 16\nReview: That result is not right.", False),
    (_Q + "Answer: ANSWER: 48\nReview: Nice, accurate and quick.", True),
    (_Q + "Answer: CALC: 12*4\nReview: You never finished with a result.", False),
    (_Q + "Answer: ANSWER: 48\nReview: Fine, correct, if a little slow.", True),
    (_Q + "Answer: ANSWER: 2400\nReview: Your number is way off.", False),
)

SELF_EXAMPLES: tuple[tuple[str, bool], ...] = (
    (_Q + "Answer: ANSWER: 48", True),
    (_Q + "Answer: ANSWER: 16", False),
    ("Question: A shelf holds 30 books shared equally by 5 friends. How many each?\nAnswer: ANSWER: 6", True),
    ("Question: A shelf holds 30 books shared equally by 5 friends. How many each?\nAnswer: ANSWER: 150", False),
    ("Question: Tom has 25 stamps and buys 17 more. How many now?\nAnswer: ANSWER: 42", True),
    ("Question: Tom has 25 stamps and buys 17 more. How many now?\nAnswer: CALC: 25+17", False),
)


def judge_settings(feedback: str) -> dict[str, Any] | None:
    """The project's ``judge`` setting for a feedback arm; None: the arm runs no judge."""
    if feedback == "comments":
        return {
            "rubric": COMMENT_RUBRIC,
            "readout": "probability",
            "labels": ["positive", "negative"],
            "examples": [{"text": text, "good": good} for text, good in COMMENT_EXAMPLES],
            "comments": True,
            "self_evaluation": False,
        }
    if feedback == "none":  # nobody grades: the served model judges its own sessions
        return {
            "rubric": JUDGE_RUBRIC + " Reply positive for a good answer, negative for a bad one.",
            "readout": "probability",
            "labels": ["positive", "negative"],
            "examples": [{"text": text, "good": good} for text, good in SELF_EXAMPLES],
            "comments": False,
            "self_evaluation": True,
        }
    return None
