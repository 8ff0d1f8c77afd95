"""Reading scores out of a model's free text, robustly; a reply we cannot read is None, never a default.

Small models rarely follow a format exactly. We accept, in this order:

1. a JSON object anywhere in the text with a ``score`` key (absolute) or the
   attempts' letters (relative, also under ``scores``);
2. a ``Score: N`` phrase (any case, markdown around it, ``= N``, ``N/10``,
   ``N out of 10``): the *last* one, since models restate the format before
   answering;
3. a bare ``N/10`` or ``N out of 10``, again the last;
4. a reply that is only a number.

Scores are returned as fractions of the scale in [0, 1]. A value with a decimal
point that is at most 1 (``0.8``) is read as already a fraction. A number outside
the scale is unreadable, not clipped: clipping would hide a judge that
misunderstood the scale.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from judge.prompts import SCALE_MAX, letters

_NUM = r"(-?\d+(?:\.\d+)?)"
_DENOM = r"(?:\s*(?:/|out\s+of|of)\s*(\d+(?:\.\d+)?))?"
_SCORE = re.compile(r"score[^\w\n-]{0,6}(?:is|of)?[^\w\n-]{0,3}" + _NUM + _DENOM, re.IGNORECASE)
_RATIO = re.compile(_NUM + r"\s*(?:/|out\s+of)\s*(\d+(?:\.\d+)?)", re.IGNORECASE)
_LINE = re.compile(
    r"^[^\w\n]*(?:[Aa]ttempt\s+)?([A-Z])[^\w\n]{0,4}[:=)\-–]\s*[^\w\n-]{0,3}" + _NUM + _DENOM, re.MULTILINE
)


def _fraction(value: str, denom: str | None, scale_max: float) -> float | None:
    v = float(value)
    if denom is not None:
        d = float(denom)
        return v / d if d > 0 and 0 <= v <= d else None
    if "." in value and 0 <= v <= 1:
        return v
    return v / scale_max if 0 <= v <= scale_max else None


def _json_objects(text: str) -> list[Any]:
    out = []
    for match in re.finditer(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}", text):
        try:
            out.append(json.loads(match.group(0)))
        except json.JSONDecodeError:
            continue
    return out


def _json_number(value: Any, scale_max: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    text = str(value).strip()
    ratio = _RATIO.fullmatch(text)
    if ratio:
        return _fraction(ratio.group(1), ratio.group(2), scale_max)
    if re.fullmatch(_NUM, text):
        return _fraction(text, None, scale_max)
    return None


def parse_score(text: str, scale_max: float = SCALE_MAX) -> float | None:
    """One score as a fraction in [0, 1], or None when the text holds none we can read."""
    for obj in reversed(_json_objects(text)):
        if isinstance(obj, dict):
            key = next((k for k in obj if str(k).lower() == "score"), None)
            if key is not None and (got := _json_number(obj[key], scale_max)) is not None:
                return got
    for pattern in (_SCORE, _RATIO):
        matches = list(pattern.finditer(text))
        if matches:
            m = matches[-1]
            return _fraction(m.group(1), m.group(2), scale_max)
    bare = text.strip().strip("*.`'\" ")
    if re.fullmatch(_NUM, bare):
        return _fraction(bare, None, scale_max)
    return None


def parse_scores(text: str, n: int, scale_max: float = SCALE_MAX) -> list[float] | None:
    """One fraction per attempt (letters A, B, …), or None unless every attempt got a readable score."""
    wanted = letters(n)
    for obj in reversed(_json_objects(text)):
        table = obj.get("scores", obj) if isinstance(obj, dict) else None
        if isinstance(table, list) and len(table) == n:
            values = [_json_number(v, scale_max) for v in table]
        elif isinstance(table, dict):
            upper = {str(k).strip().upper().removeprefix("ATTEMPT ").strip(): v for k, v in table.items()}
            values = [_json_number(upper[a], scale_max) if a in upper else None for a in wanted]
        else:
            continue
        if all(v is not None for v in values):
            return [float(v) for v in values if v is not None]
    found: dict[str, float | None] = {}
    for m in _LINE.finditer(text):
        if m.group(1) in wanted:
            found[m.group(1)] = _fraction(m.group(2), m.group(3), scale_max)  # the last line per letter wins
    values = [found.get(a) for a in wanted]
    return [float(v) for v in values if v is not None] if all(v is not None for v in values) else None


def to_scale(fraction: float, scale: Sequence[float]) -> float:
    """A fraction in [0, 1] mapped onto the project's reward range ``[low, high]``."""
    low, high = scale[0], scale[1]
    return low + fraction * (high - low)
