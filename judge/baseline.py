"""A keyword scorer: comment words → a score. The yardstick a model judge has to beat.

Counts positive and negative cue phrases in a comment (a cue preceded by a
negation within two words flips: "not correct" is negative); the score is the
positive share. A comment with no cue has no score (None), as an unreadable
judge reply has none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

POSITIVE = (
    "correct",
    "right",
    "good",
    "great",
    "perfect",
    "exactly",
    "well done",
    "nice",
    "brief",
    "concise",
    "to the point",
    "spot on",
    "accurate",
    "thanks",
    "thank you",
    "helpful",
    "works",
    "solved",
)
NEGATIVE = (
    "wrong",
    "incorrect",
    "mistake",
    "error",
    "too long",
    "too large",
    "too big",
    "too small",
    "too high",
    "too low",
    "verbose",
    "rambling",
    "bad",
    "fails",
    "failed",
    "off",
    "missed",
    "useless",
    "not what",
    "no answer",
    "timed out",
    "confused",
)
NEGATIONS = ("not", "never", "no", "isn't", "wasn't", "hardly", "n't")


def _cues(text: str, phrases: Iterable[str]) -> list[tuple[int, str]]:
    found = []
    for phrase in phrases:
        for m in re.finditer(r"\b" + re.escape(phrase) + r"\b", text):
            found.append((m.start(), phrase))
    return found


def _negated(text: str, start: int) -> bool:
    before = re.findall(r"[a-z']+", text[max(0, start - 30) : start])[-2:]
    return any(w in NEGATIONS or w.endswith("n't") for w in before)


def keyword_score(comment: str | None) -> float | None:
    """Positive cues / all cues in [0, 1], or None when the comment has no cue at all."""
    if not comment:
        return None
    text = comment.lower()
    pos = neg = 0
    negative = _cues(text, NEGATIVE)
    covered = {(s, s + len(p)) for s, p in negative}
    for start, _ in _cues(text, POSITIVE):
        if any(a <= start < b for a, b in covered):
            continue  # "right" inside a longer negative phrase
        if _negated(text, start):
            neg += 1
        else:
            pos += 1
    for start, _ in negative:
        if _negated(text, start):
            pos += 1
        else:
            neg += 1
    return pos / (pos + neg) if pos + neg else None
