"""The statistics of promotion decisions, as pure functions: a mean with its standard error, the
difference of two (paired when both scored the same items), and the gate's and the canary's verdicts,
per task family (an eval name: each family's held-out set is compared on its own, never pooled).

storage/promotion.py keeps the policies, events and evals in the database; proxy/promotion.py decides
with these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from storage.models import Eval


@dataclass(frozen=True)
class Stats:
    """A mean with its standard error over ``n`` items; ``scores`` by item id when known (for pairing)."""

    n: int
    mean: float
    stderr: float
    scores: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, scores: Mapping[str, float]) -> Stats:
        """Mean and standard error (sample standard deviation / √n) of per-item scores."""
        values = list(scores.values())
        n = len(values)
        mean = sum(values) / n if n else 0.0
        var = sum((x - mean) ** 2 for x in values) / (n - 1) if n > 1 else 0.0
        return cls(n, mean, math.sqrt(var / n) if n else 0.0, dict(scores))

    @classmethod
    def from_eval(cls, row: Eval) -> Stats:
        return cls(row.n, row.mean, row.stderr, {str(k): float(v) for k, v in (row.scores or {}).items()})


@dataclass(frozen=True)
class Comparison:
    """candidate − serving, with the standard error of that difference (paired when both scored the same items)."""

    diff: float
    se: float
    paired: bool
    candidate: Stats
    serving: Stats
    coverage: float = 1.0  # share of the serving version's scored items the candidate scored too

    def to_dict(self) -> dict[str, Any]:
        def side(s: Stats) -> dict[str, Any]:
            return {"n": s.n, "mean": s.mean, "stderr": s.stderr}

        return {
            "diff": self.diff,
            "se": self.se,
            "paired": self.paired,
            "coverage": self.coverage,
            "candidate": side(self.candidate),
            "serving": side(self.serving),
        }


# A gate candidate whose eval scored less than this share of the serving version's items is held:
# the items it could not answer (errors, timeouts) are exactly where it may be worse.
MIN_COVERAGE = 0.9


def compare(candidate: Stats, serving: Stats) -> Comparison:
    """Paired over the items both scored (when at least two are shared), else independent samples.

    Pairing removes the items' own difficulty from the difference's standard error; an item only one
    side scored cannot be paired and is left out of the paired difference (``coverage`` says how much).
    """
    common = set(candidate.scores) & set(serving.scores)
    coverage = len(common) / len(serving.scores) if serving.scores and candidate.scores else 1.0
    if len(common) > 1:
        diffs = Stats.of({k: candidate.scores[k] - serving.scores[k] for k in common})
        return Comparison(diffs.mean, diffs.stderr, True, candidate, serving, coverage)
    se = math.sqrt(candidate.stderr**2 + serving.stderr**2)
    return Comparison(candidate.mean - serving.mean, se, False, candidate, serving, coverage)


def clearly_worse(cmp: Comparison, margin: float, z: float) -> bool:
    """The candidate is worse than the serving version by more than ``margin``, beyond ``z`` standard errors."""
    return cmp.diff < -margin and cmp.diff + z * cmp.se <= -margin


def clearly_not_worse(cmp: Comparison, margin: float, z: float) -> bool:
    """Non-inferiority: the difference's lower bound (``z`` standard errors) is above ``-margin``."""
    return cmp.diff - z * cmp.se > -margin


def gate_verdict(cmp: Comparison, margin: float, z: float) -> Literal["promoted", "held"]:
    """``gate``, one family: promoted unless the eval says the candidate is clearly worse by more than the margin,
    or it scored too few of the serving version's items to tell (:data:`MIN_COVERAGE`)."""
    return "held" if cmp.coverage < MIN_COVERAGE or clearly_worse(cmp, margin, z) else "promoted"


def gate_reason(cmp: Comparison, margin: float, z: float) -> str:
    """One family's figures and what :func:`gate_verdict` makes of them."""
    if cmp.coverage < MIN_COVERAGE:
        return (
            f"eval scored {cmp.coverage:.0%} of the serving version's items (under {MIN_COVERAGE:.0%}): "
            f"what it did not answer may be where it is worse"
        )
    where = "clearly worse" if clearly_worse(cmp, margin, z) else "not clearly worse"
    return (
        f"eval {cmp.candidate.mean:.3f} vs serving {cmp.serving.mean:.3f}: diff {cmp.diff:+.3f} ± {cmp.se:.3f} "
        f"({'paired' if cmp.paired else 'independent'}), {where} than margin {margin} at z {z}"
    )


def gate_families(
    families: Mapping[str, Comparison], margin: float, z: float
) -> tuple[Literal["promoted", "held"], str]:
    """``gate`` over every task family (eval name) compared: (decision, why). Held when any family is held by
    :func:`gate_verdict`, and the reason names each such family first, with its figures; promoted only
    when none is. With one family this is :func:`gate_verdict` and :func:`gate_reason`, word for word.

    ``margin`` is the policy's (at least 0, in each family's own eval units, e.g. reward points on a
    0-1 scale) and applies to every family on its own: a family is worse beyond it when
    d = candidate − serving < −margin and d + z·se ≤ −margin. Families are not pooled, so a gain in
    one never pays for a loss in another. The gate's rule for improvement is only that: not clearly
    worse anywhere (it asks no family to rise). Each family is tested at ``z`` separately, with no
    correction for how many there are: a candidate equal to serving everywhere is held by chance a
    little more often with several families (at margin 0 and z 2, about 2.3 % per family).
    """
    decided = {name: gate_verdict(cmp, margin, z) for name, cmp in sorted(families.items())}
    if len(families) == 1:
        ((name, verdict),) = decided.items()
        return verdict, gate_reason(families[name], margin, z)
    held = [name for name, verdict in decided.items() if verdict == "held"]
    order = held + [name for name in decided if name not in held]
    figures = "; ".join(f"{name}: {gate_reason(families[name], margin, z)}" for name in order)
    if held:
        return "held", f"worse on {', '.join(held)} ({len(held)} of {len(families)} families). {figures}"
    return "promoted", f"no family worse ({len(families)} families). {figures}"


def family_evidence(families: Mapping[str, Comparison], margin: float, z: float) -> dict[str, Any]:
    """A decision's eval evidence: every family's comparison and gate verdict (``families``), and under
    ``eval`` the family with the lowest difference among the held ones (among all when none is held),
    named, as one-family decisions always recorded it."""
    decided = {name: gate_verdict(cmp, margin, z) for name, cmp in families.items()}
    worst = min(families, key=lambda name: (decided[name] == "promoted", families[name].diff))
    return {
        "eval": families[worst].to_dict() | {"name": worst},
        "families": {name: cmp.to_dict() | {"gate": decided[name]} for name, cmp in sorted(families.items())},
    }


def canary_verdict(
    live: Comparison | None, families: Mapping[str, Comparison], margin: float, z: float, min_sample: int
) -> tuple[Literal["promoted", "rolled_back"] | None, str]:
    """``canary``: (decision or None to keep collecting, why). Live reward decides after ``min_sample`` per arm;
    an eval of any family that says the candidate is clearly worse rolls it back whatever the live sample,
    and the reason names the family."""
    worse = [name for name, cmp in sorted(families.items()) if clearly_worse(cmp, margin, z)]
    if worse:
        named = ", ".join(f"{name} {families[name].diff:+.3f} ± {families[name].se:.3f}" for name in worse)
        return "rolled_back", f"eval {named} below the serving version"
    if live is None or min(live.candidate.n, live.serving.n) < min_sample:
        have = 0 if live is None else min(live.candidate.n, live.serving.n)
        return None, f"{have} of {min_sample} graded sessions per arm"
    if clearly_worse(live, margin, z):
        return "rolled_back", f"live reward {live.diff:+.3f} ± {live.se:.3f} below the serving version"
    if clearly_not_worse(live, margin, z):
        return "promoted", f"live reward {live.diff:+.3f} ± {live.se:.3f}: not worse by more than {margin}"
    return None, f"live reward {live.diff:+.3f} ± {live.se:.3f}: not clear yet"
