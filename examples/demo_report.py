"""The demo's report: one table row per round, the held-out plot and ``summary.json``.

What :mod:`examples.demo` measured, written out; nothing here starts a process or sends a call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.episodes import Summary
from examples.task import grade, make_problems

if TYPE_CHECKING:  # the run's settings and stack, read for the summary's header
    from examples.demo_stack import DemoConfig, Stack


@dataclass
class RoundResult:
    """One row of the table."""

    round: int
    adapter_version: int | None  # what served this round's held-out and training traffic
    heldout: Summary | None  # None: held-out not evaluated this round (DemoConfig.eval_every)
    train: Summary | None  # None: the final evaluation-only round
    traffic_tokens: int = 0
    feedback: dict[str, int] = field(default_factory=dict)  # feedback names posted by the harness
    trained_version: int | None = None  # what `onthejob train` deployed at the end of the round
    excluded: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    # --promotion gate: the held-out pass evaluates the pending candidate (adapter_version) and is
    # posted as its eval; the verdict, and the version that then served the training traffic.
    verdict: str | None = None
    traffic_version: int | None = None
    flipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trivial_baseline(n: int) -> dict[str, Any]:
    """The best constant answer on the held-out set (what a policy that ignores the question gets)."""
    problems = make_problems("heldout", n)
    best = max(("0", "1", "10", "100", "1000"), key=lambda c: sum(grade(p, c, 8).reward for p in problems))
    return {"answer": best, "mean_reward": sum(grade(p, best, 8).reward for p in problems) / len(problems)}


HEADER = (
    f"{'round':>5} {'adapter':>7} {'held-out reward':>17} {'acc':>5} {'tok/ep':>6} {'verdict':>8} {'served':>6} "
    f"{'train reward':>12} {'tokens':>7} {'trained':>8}  excluded"
)


def table_row(r: RoundResult) -> str:
    h, t = r.heldout, r.train
    adapter = f"v{r.adapter_version}" if r.adapter_version else "base"
    deployed = "-" if t is None else (f"v{r.trained_version}" if r.trained_version else "base")
    excluded = ", ".join(f"{k}={v}" for k, v in sorted(r.excluded.items())) or "-"
    if h is None:
        scores = f"{'not evaluated':>16} {'-':>5} {'-':>6}"  # as wide as an evaluated row's
    else:
        scores = (
            f"{100 * h.mean_reward:>8.1f} ± {100 * h.stderr:>4.1f}  {100 * h.accuracy:>4.0f}% "
            f"{h.mean_completion_tokens:>6.1f}"
        )
    served = "-" if t is None else (f"v{r.traffic_version}" if r.traffic_version else "base")
    reward = "-" if t is None else f"{100 * t.mean_reward:.1f}{'*' if r.flipped else ''}"  # *: graded flipped
    return (
        f"{r.round:>5} {adapter:>7} {scores} {r.verdict or '-':>8} {served:>6} {reward:>12} "
        f"{r.traffic_tokens:>7} {deployed:>8}  {excluded}"
    )


def failure_lines(r: RoundResult) -> list[str]:
    """For each part of a round that had failed calls: how many, and why (the reasons counted)."""
    lines = []
    for part, summary in (("held-out", r.heldout), ("training traffic", r.train)):
        if summary is None or not summary.errors:
            continue
        total = summary.n + summary.errors
        why = "; ".join(
            f"{count}× {reason}" for reason, count in sorted(summary.failures.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        lines.append(
            f"  round {r.round} {part}: {summary.errors} of {total} episodes failed"
            f"{' (' + why + ')' if why else ''}; the reward above counts only the others"
        )
    return lines


def final_failures(summary: dict[str, Any]) -> int:
    """How many episodes of the final held-out evaluation failed (the demo then exits non-zero)."""
    return int(summary.get("final_heldout_failed", 0))


def write_plot(rounds: Sequence[RoundResult], baseline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r for r in rounds if r.heldout is not None]  # the evaluated ones
    x = [r.round for r in rounds]
    y = [100 * r.heldout.mean_reward for r in rounds if r.heldout]
    err = [100 * r.heldout.stderr for r in rounds if r.heldout]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label="held-out reward (± s.e.)")
    ax.axhline(y[0], color="grey", linestyle="--", linewidth=1, label="base model")
    ax.axhline(100 * baseline, color="firebrick", linestyle=":", linewidth=1, label="best constant answer")
    ax.set_xticks(x, [f"{r.round}\n{'v' + str(r.adapter_version) if r.adapter_version else 'base'}" for r in rounds])
    ax.set_xlabel("round (adapter serving it)")
    ax.set_ylabel("reward (0–100)")
    ax.set_ylim(0, 100)
    ax.set_title("On-the-job training: held-out reward per round")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_summary(
    cfg: DemoConfig,
    stack: Stack,
    rounds: Sequence[RoundResult],
    baseline: dict[str, Any],
    path: Path,
    seconds: float,
    alerts: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    base, last = rounds[0].heldout, rounds[-1].heldout  # the first and the last round are always evaluated
    assert base is not None and last is not None
    summary = {
        "command": "onthejob demo " + f"--rounds {cfg.rounds} --out {cfg.out} --model {cfg.model} "
        f"--feedback {cfg.feedback} --seed {cfg.seed} --eval-every {cfg.eval_every} --promotion {cfg.promotion}"
        + (f" --flip-reward {','.join(map(str, cfg.flip_reward))}" if cfg.flip_reward else "")
        + ("" if cfg.judge else " --no-judge")
        + (f" --correct {cfg.correct}" if cfg.correct != "last" else ""),
        "promotion": cfg.promotion,
        "feedback": cfg.feedback,
        "model": stack.model_name,
        "project": stack.project,
        "database": stack.db_url.split("@")[-1],
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "trivial_baseline": baseline,
        "rounds": [
            {
                "round": r.round,
                "adapter_version": r.adapter_version,
                "evaluated": r.heldout is not None,
                "heldout_mean_reward": r.heldout.mean_reward if r.heldout else None,
                "heldout_stderr": r.heldout.stderr if r.heldout else None,
                "heldout_n": r.heldout.n if r.heldout else 0,
                "heldout_accuracy": r.heldout.accuracy if r.heldout else None,
                "heldout_completion_tokens": r.heldout.mean_completion_tokens if r.heldout else None,
                "heldout_failed": r.heldout.errors if r.heldout else 0,
                "heldout_failures": r.heldout.failures if r.heldout else {},
                "train_failed": r.train.errors if r.train else 0,
                "train_failures": r.train.failures if r.train else {},
                "train_mean_reward": r.train.mean_reward if r.train else None,
                "train_n": r.train.n if r.train else 0,
                "traffic_tokens": r.traffic_tokens,
                "feedback": r.feedback,
                "trained_version": r.trained_version,
                "excluded": r.excluded,
                "verdict": r.verdict,
                "traffic_version": r.traffic_version,
                "flipped_reward": r.flipped,
                "seconds": r.seconds,
            }
            for r in rounds
        ],
        "base_heldout_mean_reward": base.mean_reward,
        "final_heldout_mean_reward": last.mean_reward,
        "improvement_points": 100 * (last.mean_reward - base.mean_reward),
        "final_heldout_failed": last.errors,
        "final_heldout_failures": last.failures,
        "failed_episodes": sum(
            (r.heldout.errors if r.heldout else 0) + (r.train.errors if r.train else 0) for r in rounds
        ),
        "seconds": round(seconds, 1),
        "alerts": list(alerts),
    }
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def raised_alerts(stack: Stack) -> list[dict[str, Any]]:
    """Every alert the run raised (open or resolved): kind, name, version and message, from the admin API."""
    rows = stack.admin("GET", "/v1/admin/alerts?status=all")["data"]
    return [{k: row[k] for k in ("kind", "name", "version", "status", "message")} for row in rows]
