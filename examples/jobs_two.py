"""``onthejob demo --jobs two``: one deployment learning two jobs at once, continuously, behind a gate.

One alias serves two task families to several simulated users at once: arithmetic with a calculator
(:mod:`examples.task`) and a support agent with an order tool (:mod:`examples.support`). Each family
gives the feedback it gives on its own: arithmetic a mix of numbers (grades, thumbs, outcomes), a
reviewer's comment now and then, and a correction of the first call's ``CALC:`` line where nobody
graded; support only the customer's words, as a comment or as the next turn of the conversation (the
project reads next turns as implicit feedback).

Beside the traffic, for the whole run, one ``onthejob train --watch --objective sdpo`` steps as graded
data arrives (TIS on the numbers, self-distillation on the text, filtered SFT on corrections). The
alias's promotion policy is ``gate`` with both families: after each publish the trainer's hook
(:func:`judge.evaluate.after_publish`) runs each family's held-out episodes against the candidate
(:func:`heldout_arithmetic`, :func:`heldout_support`: the harness's own multi-turn episodes, greedy)
and posts them; the gate promotes the candidate only when neither family is clearly worse than what
serves, and otherwise holds it, naming the family. A held version never serves and is never a parent.

At the end the demo reads back from the deployment what happened (:mod:`examples.jobs_report`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from examples.demo_stack import CLI, DemoConfig, DemoError, Stack, cli_fields, say, stop
from examples.episodes import RunsEpisodes, run_episodes
from examples.feedback import correction
from examples.harness import EpisodeResult, HarnessConfig, fraction_of
from examples.jobs_report import FAMILIES, curves, lift, render, source_counts, verdicts, write_plot
from examples.support import SupportProblem, make_support_problems
from examples.support_harness import SupportHarness, Voice
from examples.task import Problem, make_problems

WAITING = "no graded trajectories"  # what the trainer says when it has caught up with the traffic
CORRECTED = 0.85  # arithmetic: the share FeedbackMix leaves ungraded gets a correction of its first call


@dataclass(frozen=True)
class JobsConfig:
    """Sizes chosen so a run fits 15 minutes on 2 CPU cores (docs/learning.md has the figures)."""

    out: Path = Path("demo-out")
    model: str = "default"
    seed: int = 0  # which training problems the users bring; held-out never changes
    minutes: float = 10.0  # traffic stops this many minutes after the run started (the trainer steps beside it)
    drain_minutes: float = 3.0  # then at most this long for the trainer's last step and its gate
    heldout: int = 48  # held-out problems per family, evaluated on every candidate
    users: int = 2  # simulated users per family at once (support's split between comments and replies)
    lr: float = 5e-4
    batch_size: int = 64
    min_batch: int = 32
    poll: float = 5.0
    eval_workers: int = 16
    engine_threads: int = 2
    progress: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JobsConfig:
        return cls(**cli_fields(cls, args))


# ---- held-out episodes, run by the trainer's after-publish hook (judge.evaluate) ----------


def _heldout(spec: Any, problems: Sequence[Problem | SupportProblem]) -> dict[str, float]:
    """Greedy episodes of ``problems`` against ``spec.model`` (alias@vN, an admin call); item id -> reward."""
    cfg = HarnessConfig(base_url=f"{spec.proxy.rstrip('/')}/v1", api_key=spec.key or "", model=spec.model)
    harness: RunsEpisodes[Any]
    with SupportHarness(cfg) as harness:
        results = run_episodes(harness, list[Any](problems), eval=True, workers=spec.concurrency, progress=False)
    return {r.problem_id: r.reward for r in results if r.outcome != "error"}


def heldout_arithmetic(spec: Any) -> dict[str, float]:
    """The arithmetic family's held-out set (the default demo's)."""
    return _heldout(spec, make_problems("heldout", spec.limit or 48))


def heldout_support(spec: Any) -> dict[str, float]:
    """The support family's held-out set."""
    return _heldout(spec, make_support_problems("heldout", spec.limit or 48))


def eval_configs(cfg: JobsConfig) -> list[dict[str, Any]]:
    """The policy's ``eval``: one per family, named as the gate's ``families``."""
    common = {"limit": cfg.heldout, "concurrency": cfg.eval_workers}
    return [{"name": name, "episodes": f"examples.jobs_two:heldout_{name}", **common} for name in FAMILIES]


# ---- traffic ---------------------------------------------------------------------------


class MixedHarness(SupportHarness):
    """Both families; arithmetic's ungraded share gets a correction of its first call (the ``CALC:`` line)."""

    def _post_feedback(self, problem: Problem, result: EpisodeResult) -> None:
        corrected = not result.eval and result.outcome == "answered" and result.completion_ids
        if not corrected or fraction_of(result.session_id) < CORRECTED or self.cfg.feedback_url is None:
            super()._post_feedback(problem, result)
            return
        item = {
            "target": {"completion_id": result.completion_ids[0]},
            "name": "correction",
            "comment": correction(problem, "first"),
            "source": self.cfg.source,
            "id": f"{result.session_id}:correction",
        }
        if self._post(item):
            result.feedback.append("correction")
        else:
            result.feedback_errors += 1


class Traffic:
    """The simulated users: one thread per (family, voice), each running chunks of episodes until stopped."""

    def __init__(self, stack: Stack, cfg: JobsConfig, episodes: IO[str]) -> None:
        self.stack, self.cfg, self.episodes = stack, cfg, episodes
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.count = 0

    def harness(self, feedback: str, voice: Voice = "comment") -> MixedHarness:
        s = self.stack
        cfg = HarnessConfig(
            base_url=f"{s.proxy_url}/v1",
            api_key=s.harness_key,
            model=s.model_name,
            feedback_url=f"{s.proxy_url}/v1/feedback",
            feedback=feedback,  # type: ignore[arg-type]
        )
        return MixedHarness(cfg, voice=voice)

    def start(self) -> None:
        seed, users = self.cfg.seed, self.cfg.users
        half = max(users // 2, 1)
        jobs: list[tuple[str, MixedHarness, Callable[[int], Sequence[Any]], int, int]] = [
            # arithmetic: a few problems, each attempted 4 times (the trainer compares attempts of one task)
            (
                "arithmetic",
                self.harness("numeric"),
                lambda c: make_problems("train", 3, seed=c + 1000 * seed + 1),
                4,
                users,
            ),
            (
                "support",
                self.harness("comments", "comment"),
                lambda c: make_support_problems("train", half, seed=2 * c + 1000 * seed),
                1,
                half,
            ),
            (
                "support",
                self.harness("comments", "reply"),
                lambda c: make_support_problems("train", half, seed=2 * c + 1 + 1000 * seed),
                1,
                half,
            ),
        ]
        for family, harness, make, attempts, workers in jobs:
            thread = threading.Thread(
                target=self._run, args=(family, harness, make, attempts, workers), name=f"users-{family}", daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def _run(
        self, family: str, harness: MixedHarness, make: Callable[[int], Sequence[Any]], attempts: int, workers: int
    ) -> None:
        chunk = 0
        with harness:
            while not self.stopping.is_set():
                results = run_episodes(harness, make(chunk), attempts=attempts, workers=workers, progress=False)
                with self.lock:
                    for r in results:
                        self.episodes.write(json.dumps({"family": family, "chunk": chunk, **r.to_dict()}) + "\n")
                    self.count += len(results)
                chunk += 1

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()


# ---- the trainer beside it ---------------------------------------------------------------


class Trainer:
    """One ``onthejob train --watch`` for the whole run; its step lines echoed, its idle lines counted."""

    def __init__(self, stack: Stack, cfg: JobsConfig) -> None:
        self.stack, self.cfg = stack, cfg
        self.log = stack.out / "train.log"
        self.waits = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader: threading.Thread | None = None

    def start(self) -> None:
        s, c = self.stack, self.cfg
        where = ["--project", s.project, "--db", s.db_url, "--proxy", s.proxy_url, "--admin-key", s.admin_key]
        what = ["--alias", s.model_name, "--model", c.model, "--adapters", str(s.adapters), "--objective", "sdpo"]
        pace = ["--lr", str(c.lr), "--batch-size", str(c.batch_size), "--min-batch", str(c.min_batch)]
        argv = [*CLI, "train", "--watch", *where, *what, *pace, "--poll", str(c.poll)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.reader = threading.Thread(target=self._read, name="trainer-log", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with self.log.open("ab") as fh:
            for raw in self.proc.stderr:
                fh.write(raw)
                fh.flush()
                line = raw.decode(errors="replace").rsplit("\r", 1)[-1].strip()
                if WAITING in line:
                    self.waits += 1
                if line.startswith(("step ", "eval ", "continuing", "loaded", "judge")) or "Error" in line:
                    say(f"  [train] {line}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        stop(self.proc)
        if self.reader is not None:
            self.reader.join(10)


# ---- the run ------------------------------------------------------------------------------


def run_jobs_two(cfg: JobsConfig, judge: Any) -> dict[str, Any]:
    """The whole run; returns what ``summary.json`` holds. ``judge``: the module :mod:`judge.evaluate`, passed in
    by the command (the demo and the judge are on one floor and never import each other: tests/test_imports.py)."""
    evaluate, spec_from_policy = judge.evaluate, judge.spec_from_policy

    started, started_at = time.monotonic(), datetime.now(UTC)
    out = cfg.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = replace(cfg, out=out)
    base = DemoConfig(out=out, model=cfg.model, seed=cfg.seed, judge=False, engine_threads=cfg.engine_threads)
    with Stack(base) as stack, (out / "episodes.jsonl").open("w") as episodes:
        alias = stack.model_name
        stack.admin("PUT", "/v1/admin/project", {"implicit_feedback": True, "implicit_feedback_skip": ["RESULT:"]})
        policy = {"mode": "gate", "eval": eval_configs(cfg), "families": list(FAMILIES)}
        stack.admin("PUT", f"/v1/admin/aliases/{alias}/policy", policy)
        fixed = {"alias": alias, "proxy": stack.proxy_url, "key": stack.admin_key, "project": stack.project}
        trainer = Trainer(stack, cfg)
        trainer.start()  # it loads the model while the base is evaluated
        try:
            say(
                f"project {stack.project}: evaluating the base model on both families ({cfg.heldout} problems each) ..."
            )
            with ThreadPoolExecutor(len(FAMILIES)) as pool:
                specs = [spec_from_policy(c, version=None, db_url=stack.db_url, **fixed) for c in eval_configs(cfg)]
                for spec, (result, _) in zip(specs, pool.map(evaluate, specs), strict=True):
                    say(f"  base {spec.name}: {100 * result.mean:.1f} ± {100 * result.stderr:.1f} (n {result.n})")
            traffic = Traffic(stack, cfg, episodes)
            say(f"{cfg.users + 2 * max(cfg.users // 2, 1)} users at once , the trainer beside them")
            traffic.start()
            _wait(trainer, started + 60 * cfg.minutes, lambda: False)
            say(f"traffic stopped after {traffic.count} episodes; waiting for the trainer's last step and its gate ...")
            traffic.stop()
            waits = trainer.waits
            _wait(trainer, time.monotonic() + 60 * cfg.drain_minutes, lambda: trainer.waits > waits)
        finally:
            trainer.close()
        summary = collect(stack, cfg, started_at, judge.list_evals)
    summary["seconds"] = round(time.monotonic() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_plot(summary, out / "heldout_families.png")
    say(render(summary))
    say(f"\n{summary['seconds'] / 60:.1f} min; wrote {out / 'summary.json'}, {out / 'heldout_families.png'}")
    return summary


def _wait(trainer: Trainer, until: float, done: Callable[[], bool]) -> None:
    while time.monotonic() < until and not done():
        if not trainer.alive():
            raise DemoError(f"`onthejob train --watch` exited; see {trainer.log}")
        time.sleep(1.0)


def collect(stack: Stack, cfg: JobsConfig, started_at: datetime, list_evals: Any) -> dict[str, Any]:
    """Read back from the deployment what each version was evaluated at, learned from, and what the gate did."""

    alias = stack.model_name
    rows, steps = _trained_items(stack)
    latest = max((s["version"] for s in steps if s["version"] is not None), default=0)
    evals = list_evals(stack.proxy_url, stack.admin_key, alias, ["base", *map(str, range(1, latest + 1))])
    events = stack.admin("GET", f"/v1/admin/aliases/{alias}/promotions")["data"]
    decided = verdicts(events, started_at)
    serving = stack.deployed_version()
    return {
        "command": " ".join(["onthejob", "demo", *sys.argv[2:]]) if len(sys.argv) > 1 else "onthejob demo --jobs two",
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "project": stack.project,
        "started_at": started_at.isoformat(),
        "serving": f"v{serving}" if serving else "base",
        "curves": curves(evals, decided, started_at),
        "final": {f: lift(evals, f, serving) for f in FAMILIES},
        "verdicts": decided,
        "sources": source_counts(rows),
        "steps": steps,
        "evals": [{k: v for k, v in e.items() if k != "scores"} for e in evals],
    }


STEP_METRICS: tuple[str, ...] = (
    *("tokens", "trajectories", "reward_mean", "loss", "sdpo_tokens", "sdpo_signal_mean", "sdpo_abs_signal_mean"),
    *("sdpo_clipped_frac", "sdpo_kl_serving", "correction_tokens", "correction_loss"),
)


def _trained_items(stack: Stack) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every item a step trained on, with what :func:`examples.jobs_report.classify` reads; and each step's metrics."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.models import Completion, Feedback, TrainingRun, TrainingStep, UsedFeedback

    engine = sync_engine(stack.db_url)
    try:
        with Session(engine) as db:
            columns = (UsedFeedback.objective, UsedFeedback.feedback_id, UsedFeedback.trajectory_id)
            used = db.execute(
                select(*columns, TrainingStep.adapter_version)
                .join(TrainingStep, TrainingStep.id == UsedFeedback.step_id)
                .where(UsedFeedback.project_id == stack.project)
            ).all()
            names = dict(
                db.execute(
                    select(Feedback.id, Feedback.name).where(Feedback.id.in_({u.feedback_id for u in used}))
                ).all()
            )
            calls = {
                c.id: c
                for c in db.scalars(
                    select(Completion).where(Completion.id.in_({u.trajectory_id.rsplit(":", 1)[0] for u in used}))
                )
            }
            rows = []
            for u in used:
                call = calls.get(u.trajectory_id.rsplit(":", 1)[0])
                reply = (((call.choices or [{}])[0] or {}).get("message") or {}).get("content") if call else None
                rows.append(
                    {
                        "version": u.adapter_version,
                        "objective": u.objective,
                        "feedback_id": u.feedback_id,
                        "feedback_name": names.get(u.feedback_id),
                        "session_id": call.session_id if call else None,
                        "reply": reply,
                    }
                )
            steps = [
                {"step": s.step, "version": s.adapter_version, **{k: (s.metrics or {}).get(k) for k in STEP_METRICS}}
                for s in db.scalars(
                    select(TrainingStep)
                    .join(TrainingRun, TrainingRun.id == TrainingStep.run_id)
                    .where(TrainingRun.project_id == stack.project)
                    .order_by(TrainingStep.id)
                )
            ]
            return rows, steps
    finally:
        engine.dispose()


def run(args: argparse.Namespace, judge: Any) -> int:
    """Entry point of ``onthejob demo --jobs two`` (``judge``: the module judge.evaluate)."""
    try:
        run_jobs_two(JobsConfig.from_args(args), judge)
    except DemoError as exc:
        print(f"onthejob demo --jobs two: {exc}", file=sys.stderr)
        return 1
    return 0
