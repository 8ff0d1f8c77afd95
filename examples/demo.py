"""``onthejob demo``: the whole loop on this machine, the way an operator would wire it by hand.

engine (vLLM) → ``onthejob db upgrade`` → ``onthejob serve`` (the recording proxy) → API keys →
for each round: held-out evaluation, training traffic with feedback (the harness in
:mod:`examples.harness`, which knows only a base URL, a key and a feedback URL), then
``onthejob train``, which trains on the graded traffic and deploys a new adapter through the
proxy; the next round is served by it. A last evaluation measures the final adapter.

Every piece runs as its own process through the public CLI, so what the demo shows is what a
deployment does. Each run gets a fresh project in the database, so earlier runs (or a shared
Postgres named by ``DATABASE_URL``) never leak into this one.

Outputs in ``--out``: ``summary.json``, ``heldout_reward.png``, ``episodes.jsonl`` and the logs of
the engine, the proxy and every training run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from examples.demo_report import (
    HEADER,
    RoundResult,
    failure_lines,
    final_failures,
    raised_alerts,
    table_row,
    trivial_baseline,
    write_plot,
    write_summary,
)
from examples.demo_stack import DemoConfig, DemoError, Stack, say
from examples.episodes import run_episodes, summarise
from examples.harness import EpisodeResult
from examples.task import make_problems


def evaluated(round_no: int, rounds: int, every: int) -> bool:
    """Is held-out evaluated in ``round_no`` (1 … rounds + 1)? The first, every ``every``-th after it, the last."""
    return round_no == 1 or round_no == rounds + 1 or (round_no - 1) % max(every, 1) == 0


def play_round(
    stack: Stack, round_no: int, *, train: bool, evaluate: bool = True
) -> tuple[RoundResult, list[EpisodeResult]]:
    """Evaluate on the held-out set if ``evaluate``; if ``train``: traffic with feedback, then a training run."""
    cfg = stack.cfg
    started = time.monotonic()
    # Under gate, the held-out pass evaluates the candidate directly (alias@vN, an admin call);
    # its result is the candidate's eval, and the gate's verdict decides what serves the traffic.
    candidate = stack.candidate()
    version = candidate if candidate is not None else stack.deployed_version()
    label = f"v{version}" if version else "base"
    evaluate = evaluate or cfg.promotion != "auto"
    heldout: list[EpisodeResult] = []
    if evaluate:
        model = f"{stack.model_name}@v{candidate}" if candidate is not None else None
        with stack.harness(model, admin=candidate is not None) as h:
            heldout = run_episodes(
                h,
                make_problems("heldout", cfg.heldout),
                eval=True,
                workers=cfg.workers,
                desc=f"round {round_no} held-out ({label})",
                progress=cfg.progress,
            )
    verdict = stack.post_eval(version, heldout) if cfg.promotion != "auto" else None
    serving = stack.deployed_version()
    flipped = train and round_no in cfg.flip_reward
    traffic: list[EpisodeResult] = []
    if train:
        served = f"v{serving}" if serving else "base"
        with stack.harness(reward_sign=-1.0 if flipped else 1.0) as h:
            problems = make_problems("train", cfg.problems, seed=round_no + 1000 * cfg.seed)
            traffic = run_episodes(
                h,
                problems,
                attempts=cfg.attempts,
                workers=cfg.workers,
                desc=f"round {round_no} traffic ({served})",
                progress=cfg.progress,
            )
    result = RoundResult(
        round=round_no,
        adapter_version=version,
        heldout=summarise(heldout) if evaluate else None,
        train=summarise(traffic) if train else None,
        traffic_tokens=sum(r.prompt_tokens + r.completion_tokens for r in traffic),
        feedback=dict(Counter(name for r in traffic for name in r.feedback)),
        verdict=verdict,
        traffic_version=serving,
        flipped=flipped,
    )
    if train:
        if stack.judge_settings is not None:
            say(f"judge: {stack.judge(round_no)}")
        stack.train(round_no)
        result.trained_version = stack.candidate() or stack.deployed_version()
        result.excluded = stack.new_exclusions()
    result.seconds = round(time.monotonic() - started, 1)
    return result, heldout + traffic


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """The whole loop; returns what ``summary.json`` holds."""
    started = time.monotonic()
    out = cfg.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = replace(cfg, out=out)
    baseline = trivial_baseline(cfg.heldout)
    rounds: list[RoundResult] = []
    with Stack(cfg) as stack, (out / "episodes.jsonl").open("w") as episodes:
        say(
            f"project {stack.project}: {cfg.rounds} rounds of {cfg.problems}×{cfg.attempts} training episodes, "
            f"{cfg.heldout} held-out problems (best constant answer: {100 * baseline['mean_reward']:.1f})"
        )
        say(HEADER)
        if cfg.flip_reward:
            say(
                f"(* rounds {', '.join(map(str, cfg.flip_reward))}: training traffic graded with the reward's sign "
                "flipped; the table shows the true reward)"
            )
        for round_no in range(1, cfg.rounds + 2):
            final = round_no == cfg.rounds + 1  # the last adapter gets evaluated too
            evaluate = evaluated(round_no, cfg.rounds, cfg.eval_every)
            result, eps = play_round(stack, round_no, train=not final, evaluate=evaluate)
            for ep in eps:
                episodes.write(json.dumps({"round": round_no, **ep.to_dict()}) + "\n")
            rounds.append(result)
            say(table_row(result))
            for line in failure_lines(result):
                say(line)
        raised = raised_alerts(stack)
        summary = write_summary(cfg, stack, rounds, baseline, out / "summary.json", time.monotonic() - started, raised)
    write_plot(rounds, baseline["mean_reward"], out / "heldout_reward.png")
    say(
        f"\nheld-out reward {100 * summary['base_heldout_mean_reward']:.1f} (base) → "
        f"{100 * summary['final_heldout_mean_reward']:.1f} (final), {summary['improvement_points']:+.1f} points; "
        f"{summary['seconds'] / 60:.1f} min"
    )
    say(
        f"alerts: {len(raised)} (GET /v1/admin/alerts?status=all)"
        + "".join(f"\n  {a['kind']}/{a['name']} on v{a['version']}: {a['message']}" for a in raised)
    )
    if failed := final_failures(summary):
        say(
            f"{failed} call(s) of the final held-out evaluation failed: the final score is not the adapter's "
            "(see the reasons above and the proxy's log)"
        )
    say(f"wrote {out / 'summary.json'}, {out / 'heldout_reward.png'}, {out / 'episodes.jsonl'}")
    return summary


def run(args: argparse.Namespace) -> int:
    """Entry point of ``onthejob demo``."""
    try:
        summary = run_demo(DemoConfig.from_args(args))
    except DemoError as exc:
        print(f"onthejob demo: {exc}", file=sys.stderr)
        return 1
    return exit_status(summary)


def exit_status(summary: dict[str, Any]) -> int:
    """Non-zero when any call of the final held-out evaluation failed: the run's headline figure is then wrong."""
    failed = final_failures(summary)
    if failed:
        print(
            f"onthejob demo: {failed} episode(s) of the final held-out evaluation failed: "
            f"{summary.get('final_heldout_failures')}",
            file=sys.stderr,
        )
        return 1
    return 0
