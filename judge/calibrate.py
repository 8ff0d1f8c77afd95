"""Does the judge agree with the grades that exist? Rank correlation, accuracy at the threshold, the gate.

A judge's grades enter training only while it agrees with the project's human
or harness grades on a labelled set (sessions graded and tagged for
calibration; the demo's held-out ``eval`` sessions). Two numbers:

* Spearman's ρ between judge scores and labels (ties get average ranks): does
  the judge order sessions as the graders do? This is the gated number.
* accuracy at the decision threshold: the share of sessions the judge puts on
  the same side of the threshold as the label (what a binary use would see).

A judge that says the same number for everything has ρ = 0 (no information),
so it never passes a positive gate. Replies that could not be read are counted,
not scored: a judge that mostly fails to answer is visible as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from storage.judge_config import Verdict, verdict


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's r; 0 when either side is constant (no information, not an error)."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"{n} scores against {len(ys)} labels")
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return 0.0
    return sxy / math.sqrt(sxx * syy)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's ρ: Pearson's r of the average ranks."""
    return pearson(average_ranks(xs), average_ranks(ys))


def accuracy_at(xs: Sequence[float], ys: Sequence[float], threshold: float) -> float:
    """Share of pairs on the same side of ``threshold`` (≥ is "good")."""
    if not xs:
        return 0.0
    return sum((x >= threshold) == (y >= threshold) for x, y in zip(xs, ys, strict=True)) / len(xs)


@dataclass(frozen=True)
class Agreement:
    """How a judge configuration did on a labelled set."""

    n: int  # pairs scored (readable replies)
    unreadable: int  # replies with no score we could read
    spearman: float
    accuracy: float
    threshold: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(scores: Sequence[float | None], labels: Sequence[float], threshold: float) -> Agreement:
    """Compare judge scores (None: unreadable) with labels, both on the project's reward scale."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores against {len(labels)} labels")
    pairs = [(s, y) for s, y in zip(scores, labels, strict=True) if s is not None]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    return Agreement(
        n=len(pairs),
        unreadable=len(scores) - len(pairs),
        spearman=spearman(xs, ys),
        accuracy=accuracy_at(xs, ys, threshold),
        threshold=threshold,
    )


def gate(result: Agreement | None, min_agreement: float, min_labelled: int) -> Verdict:
    """Grades count only with enough labelled pairs and ρ ≥ ``min_agreement`` (:func:`storage.judge_config.verdict`)."""
    if result is None:
        return verdict(None, None, min_agreement, min_labelled)
    return verdict(result.n, result.spearman, min_agreement, min_labelled)
