"""The demo's feedback arms side by side: lift per arm with its standard error, one table, one plot.

``python -m examples.arms docs/demo/arms/*.json`` reads the ``summary.json`` of each
``onthejob demo --feedback ARM --seed S`` run and prints, per arm, the lift: the mean
held-out reward of the last two evaluated rounds minus round 1 (the base model).

The standard error of one run's lift comes from the held-out standard errors the demo
reports, treating the three rounds as independent: ``sqrt(se1² + (se_a² + se_b²) / 4)``.
The rounds share their 48 problems, so their errors are positively correlated and this
overstates the error (a conservative claim). An arm's lift is the mean over its seeds,
its error ``sqrt(Σ se²) / k``; the spread between seeds is printed beside it. A claim
("comments reach half the numeric lift") is made only when it holds beyond one standard error.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROUNDS = 4  # the runs compared: `--rounds 4`, so five held-out rows (the last is evaluation only)


@dataclass(frozen=True)
class Run:
    arm: str
    seed: int
    curve: list[tuple[float, float]]  # held-out (mean reward, stderr) per row, rows 1..ROUNDS + 1
    source: str

    @property
    def lift(self) -> tuple[float, float]:
        (r1, s1), (ra, sa), (rb, sb) = self.curve[0], self.curve[-2], self.curve[-1]
        return (ra + rb) / 2 - r1, math.sqrt(s1**2 + (sa**2 + sb**2) / 4)


def load(path: Path, rounds: int = ROUNDS) -> Run:
    """One run; a longer run contributes its first ``rounds + 1`` rows (the same procedure up to there)."""
    data = json.loads(path.read_text())
    rows = data["rounds"][: rounds + 1]
    if len(rows) < rounds + 1:
        raise ValueError(f"{path}: {len(rows)} held-out rows, {rounds + 1} needed")
    cfg = data.get("config", {})
    arm = str(data.get("feedback", cfg.get("feedback", "numeric")))
    if cfg.get("sdpo_form", "token") != "token" and arm in ("comments", "corrections"):
        arm += f"/{cfg['sdpo_form']}"  # the same feedback taught another way is its own arm
    if cfg.get("sdpo_baseline", "none") != "none" and arm in ("comments", "corrections"):
        arm += f"/{cfg['sdpo_baseline']}"
    if arm.startswith("comments") and not cfg.get("judge", False):  # runs before the judge read comments
        arm += "/no-judge"
    if arm == "corrections" and cfg.get("correct", "last") != "last":
        arm += f"/{cfg['correct']}"  # the first call's CALC line corrected, not the last call's ANSWER line
    if arm.startswith(("comments", "corrections")) and float(cfg.get("sdpo_weight", 1.0)) != 1.0:
        arm += f"/sdpo-weight-{float(cfg['sdpo_weight']):g}"  # 0: the judge's scores (or SFT) alone
    return Run(
        arm=arm,
        seed=int(cfg.get("seed", 0)),
        curve=[(float(r["heldout_mean_reward"]), float(r["heldout_stderr"])) for r in rows],
        source=str(path),
    )


def arm_lift(runs: Sequence[Run]) -> tuple[float, float, float]:
    """Mean lift over seeds, its standard error, and the spread (max - min) between seeds."""
    lifts = [r.lift for r in runs]
    mean = sum(lift for lift, _ in lifts) / len(lifts)
    se = math.sqrt(sum(s**2 for _, s in lifts)) / len(lifts)
    return mean, se, max(lift for lift, _ in lifts) - min(lift for lift, _ in lifts)


def verdict(comments: tuple[float, float], numeric: tuple[float, float]) -> str:
    """Does the comments arm reach half the numeric arm's lift, beyond one standard error?"""
    (c, cs), (n, ns) = comments, numeric
    diff, se = c - n / 2, math.sqrt(cs**2 + (ns / 2) ** 2)
    if diff - se >= 0:
        return f"comments reach half the numeric lift ({100 * diff:+.1f} ± {100 * se:.1f} points above it)"
    if diff + se < 0:
        return f"comments fall short of half the numeric lift ({100 * diff:+.1f} ± {100 * se:.1f} points)"
    return f"inconclusive: comments minus half the numeric lift is {100 * diff:+.1f} ± {100 * se:.1f} points"


def by_arm(runs: Sequence[Run]) -> dict[str, list[Run]]:
    arms: dict[str, list[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.arm, r.seed)):
        arms.setdefault(run.arm, []).append(run)
    return arms


def table(runs: Sequence[Run]) -> list[str]:
    lines = [f"{'arm':<26} {'seeds':<6} {'round 1':>8} {'last two':>9} {'lift (± s.e.)':>16} {'seed spread':>12}"]
    for arm, rs in by_arm(runs).items():
        lift, se, spread = arm_lift(rs)
        first = sum(r.curve[0][0] for r in rs) / len(rs)
        last = sum((r.curve[-2][0] + r.curve[-1][0]) / 2 for r in rs) / len(rs)
        seeds = ",".join(str(r.seed) for r in rs)
        lines.append(
            f"{arm:<26} {seeds:<6} {100 * first:>8.1f} {100 * last:>9.1f} "
            f"{100 * lift:>+8.1f} ± {100 * se:>4.1f} {100 * spread:>12.1f}"
        )
    arms = by_arm(runs)
    for name in (a for a in arms if a.startswith("comments") and "numeric" in arms):  # every way comments taught
        c, cs, _ = arm_lift(arms[name])
        n, ns, _ = arm_lift(arms["numeric"])
        lines.append(f"{name}: {verdict((c, cs), (n, ns))}")
    return lines


def plot(runs: Sequence[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for arm, rs in by_arm(runs).items():
        x = list(range(1, len(rs[0].curve) + 1))
        y = [100 * sum(r.curve[i][0] for r in rs) / len(rs) for i in range(len(x))]
        err = [100 * math.sqrt(sum(r.curve[i][1] ** 2 for r in rs)) / len(rs) for i in range(len(x))]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"{arm} ({len(rs)} seed{'s' * (len(rs) > 1)})")
    ax.set_xlabel("round (1: base model; each later round: the adapter trained on the one before)")
    ax.set_ylabel("held-out reward (0–100, ± s.e.)")
    ax.set_ylim(0, 100)
    ax.set_title("Learning from what the job gives: held-out reward per feedback arm")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.arms", description=__doc__.splitlines()[0])
    p.add_argument("summaries", nargs="+", type=Path, help="summary.json files of demo runs")
    p.add_argument("--plot", type=Path, default=None, help="write the curves here (PNG)")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    args = p.parse_args(argv)
    runs = [load(path, args.rounds) for path in args.summaries]
    for line in table(runs):
        print(line)
    if args.plot is not None:
        plot(runs, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
