"""Reading scores from what small models actually write."""

from __future__ import annotations

import pytest

from judge.parse import parse_score, parse_scores, to_scale


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is right and short.\nScore: 9", 0.9),
        ("**Score:** 7/10", 0.7),
        ("score = 4 out of 10", 0.4),
        ("I would rate it 3 out of 10.", 0.3),
        ('{"reasoning": "ok", "score": 6}', 0.6),
        ('Here: {"Score": "8/10"} done', 0.8),
        ("Score: 0.85", 0.85),  # a decimal at most 1 is already a fraction
        ("7", 0.7),
        ("**10.**", 1.0),
        ("Format: 'Score: N'. My verdict...\nScore: 2", 0.2),  # the last Score wins
        ("The product 3 x 4 = 12 is correct. Score: 10", 1.0),
    ],
)
def test_scores_in_many_shapes(text: str, expected: float) -> None:
    assert parse_score(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["", "Looks good to me!", "Score: 14", "Score: -3", "12 apples and 5 pears", "{bad json"]
)
def test_unreadable_is_none_never_a_default(text: str) -> None:
    assert parse_score(text) is None


def test_relative_scores_by_letter_json_and_partial() -> None:
    assert parse_scores("B is best.\nA: 3\nB: 9\nC: 5/10", 3) == pytest.approx([0.3, 0.9, 0.5])
    assert parse_scores("Attempt A - 2\nAttempt B - 8", 2) == pytest.approx([0.2, 0.8])
    assert parse_scores('{"scores": {"A": 1, "B": 10}}', 2) == pytest.approx([0.1, 1.0])
    assert parse_scores('{"scores": [4, 6]}', 2) == pytest.approx([0.4, 0.6])
    assert parse_scores("A: 3", 2) is None  # every attempt must get a score
    assert parse_scores("A: 3\nB: 11", 2) is None


def test_to_scale() -> None:
    assert to_scale(0.25, (0.0, 100.0)) == 25.0
    assert to_scale(1.0, (-1.0, 1.0)) == 1.0
