"""Calibration math and the gate, worked by hand."""

from __future__ import annotations

import pytest

from judge.baseline import keyword_score
from judge.calibrate import accuracy_at, agreement, average_ranks, gate, spearman
from storage.judge_config import JUDGE_UNCALIBRATED


def test_average_ranks_share_ties() -> None:
    assert average_ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]


def test_spearman_perfect_inverted_constant_and_ties() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([5, 5, 5, 5], [1, 2, 3, 4]) == 0.0  # a constant judge carries no information
    # ranks x = 1, 2.5, 2.5, 4 against y = 1..4: r = 4.5 / sqrt(4.5 · 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)


def test_accuracy_at_threshold() -> None:
    assert accuracy_at([0.9, 0.2, 0.6, 0.4], [1.0, 0.0, 0.0, 1.0], 0.5) == 0.5


def test_agreement_counts_unreadable_replies_apart() -> None:
    a = agreement([0.9, None, 0.1, 0.8], [1.0, 1.0, 0.0, 1.0], 0.5)
    assert (a.n, a.unreadable, a.accuracy) == (3, 1, 1.0)
    with pytest.raises(ValueError):
        agreement([0.1], [0.1, 0.2], 0.5)


def test_gate() -> None:
    good = agreement([0.1, 0.2, 0.3, 0.9], [0, 0, 1, 1], 0.5)
    assert gate(good, 0.6, 4).accepted
    refused = gate(agreement([0.9, 0.8, 0.3, 0.1], [0, 0, 1, 1], 0.5), 0.6, 4)
    assert not refused.accepted and refused.reason == JUDGE_UNCALIBRATED
    assert gate(good, 0.6, 5).reason == JUDGE_UNCALIBRATED  # too few labelled pairs
    assert gate(None, 0.6, 1).reason == JUDGE_UNCALIBRATED  # never calibrated


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("Correct and brief, well done.", 1.0),
        ("Wrong operation: you added instead of subtracting.", 0.0),
        ("Not correct, the result is too large.", 0.0),
        ("Right answer but far too long.", 0.5),
        ("Thanks.", 1.0),
        ("See ticket 4711.", None),
        (None, None),
    ],
)
def test_keyword_baseline(comment: str | None, expected: float | None) -> None:
    assert keyword_score(comment) == (None if expected is None else pytest.approx(expected))
