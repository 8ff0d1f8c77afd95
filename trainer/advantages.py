"""Advantages for logged traffic: RLOO where attempts share a task, a running baseline elsewhere.

Production traffic rarely comes in GRPO-style groups. When it does (several
sessions with the same task id, or the ``n > 1`` choices of one call), the
leave-one-out mean of the *other* attempts is an unbiased baseline that needs
no state (RLOO). A lone attempt is compared with a running per-task baseline
b(task) instead, falling back to the running mean over all tasks, then to the
batch mean, for a task never seen before.

Normalisation divides by the batch's standard deviation but does not re-centre:
re-centring a batch that mixes RLOO groups with baseline-compared attempts
would flip the sign of some attempts' advantages (an attempt better than its own
group could end up below zero), and the "missing μ → keep only positive
advantages" rule depends on that sign.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

GLOBAL = "*"  # baseline key for "any task"
NO_TASK = ""  # baseline key for attempts without a task id


@dataclass
class TaskBaseline:
    """Running mean reward per task: a plain mean over the first ``window`` rewards, then an EMA.

    Kept as plain numbers so it can be stored in ``TrainingRun.config`` and
    picked up by the next run.
    """

    window: int = 10
    means: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def get(self, task: str | None) -> float | None:
        """b(task), else the running mean over all tasks, else None."""
        key = NO_TASK if task is None else task
        if key in self.means:
            return self.means[key]
        return self.means.get(GLOBAL)

    def update(self, task: str | None, reward: float) -> None:
        """Fold one reward into b(task) and into the all-task mean."""
        for key in (NO_TASK if task is None else task, GLOBAL):
            n = self.counts.get(key, 0) + 1
            old = self.means.get(key, 0.0)
            self.means[key] = old + (reward - old) / min(n, self.window)
            self.counts[key] = n

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "means": dict(self.means), "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TaskBaseline:
        if not data:
            return cls()
        return cls(
            window=int(data.get("window", 10)),
            means={str(k): float(v) for k, v in data.get("means", {}).items()},
            counts={str(k): int(v) for k, v in data.get("counts", {}).items()},
        )


def rloo(rewards: Sequence[float]) -> list[float]:
    """Leave-one-out advantages: r_i − mean(r_j, j ≠ i). Needs at least two rewards."""
    n = len(rewards)
    if n < 2:
        raise ValueError("RLOO needs at least two graded attempts in a group")
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def raw_advantages(
    rewards: Sequence[float],
    groups: Sequence[str | None],
    tasks: Sequence[str | None],
    baseline: TaskBaseline,
) -> list[float]:
    """Unnormalised advantages; updates ``baseline`` with this batch's rewards afterwards.

    Every baseline value is read before any of this batch's rewards is folded in,
    so an attempt's own reward never sits in its baseline.
    """
    if not (len(rewards) == len(groups) == len(tasks)):
        raise ValueError("rewards, groups and tasks must have the same length")
    members: dict[str, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        if group is not None:
            members[group].append(i)
    batch_mean = sum(rewards) / len(rewards) if rewards else 0.0
    out = [0.0] * len(rewards)
    for i, reward in enumerate(rewards):
        group = groups[i]
        if group is not None and len(members[group]) >= 2:
            continue  # filled by RLOO below
        b = baseline.get(tasks[i])
        out[i] = reward - (batch_mean if b is None else b)
    for idx in members.values():
        if len(idx) >= 2:
            for i, a in zip(idx, rloo([rewards[i] for i in idx]), strict=True):
                out[i] = a
    for task, reward in zip(tasks, rewards, strict=True):
        baseline.update(task, reward)
    return out


def normalise(advantages: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Divide by the batch's (population) standard deviation; leave a constant batch unscaled."""
    n = len(advantages)
    if n == 0:
        return []
    mean = sum(advantages) / n
    std = math.sqrt(sum((a - mean) ** 2 for a in advantages) / n)
    if std < eps:
        return list(advantages)
    return [a / std for a in advantages]


def compute_advantages(
    rewards: Sequence[float],
    groups: Sequence[str | None],
    tasks: Sequence[str | None],
    baseline: TaskBaseline,
) -> list[float]:
    """RLOO or running-baseline advantages, normalised over the batch (the trainer's default)."""
    return normalise(raw_advantages(rewards, groups, tasks, baseline))
