"""The demo's processes: its configuration, and the engine, database, proxy and keys it starts.

:class:`Stack` starts each piece through the public CLI, as an operator would by hand, and
stops them; :mod:`examples.demo` plays the rounds on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from examples.demo_judge import judge_settings
from examples.episodes import summarise
from examples.harness import EpisodeResult, Harness, HarnessConfig

CLI = [sys.executable, "-m", "onthejob.cli"]
CARRIED = ("eval", "ungraded")  # exclusions that are not used up: counted again by every run


def say(text: str) -> None:
    print(text, flush=True)


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and where its log is."""


def cli_fields(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The CLI's values for a config dataclass's fields (those given; ``out`` as a Path)."""
    names = (f.name for f in dataclasses.fields(cls))
    fields = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    if "out" in fields:
        fields["out"] = Path(fields["out"])
    return fields


@dataclass(frozen=True)
class DemoConfig:
    """Sizes chosen so the default run fits 15 minutes on 2 CPU cores (see the README's figures)."""

    rounds: int = 6
    out: Path = Path("demo-out")
    model: str = "default"
    upstream: str | None = None  # an engine already running; None: start one
    database_url: str | None = None  # None: $DATABASE_URL, else a SQLite file in `out`
    heldout: int = 48  # held-out problems, evaluated greedily (all of them) on the rounds `evaluated` names
    # Held-out evaluation at round 1, every `eval_every`-th round after it, and the last round. 1,
    # every round, since engine/cpu_lora.py made an evaluation under an adapter cost what one on the
    # base model does (~25 s; it was ~65 s, and the default was 2). The rounds not evaluated are
    # shown as such, never interpolated.
    eval_every: int = 1
    problems: int = 12  # training problems per round ...
    attempts: int = 4  # ... each attempted this many times (the trainer groups attempts by task)
    train_steps: int = 1
    batch_size: int = 64
    lr: float = 5e-4
    engine_threads: int = 2
    workers: int = 24  # episodes in flight: vLLM batches them (measured: 8 → 24 is 1.5× faster on 2 cores)
    # What training traffic is graded with (examples.harness.FeedbackArm): numeric (today's mix),
    # comments or corrections (trained with --objective sdpo), none (no feedback at all).
    feedback: str = "numeric"
    # How comments and corrections teach (train --sdpo-form): token (the sampled-token signal) or topk
    # (reverse KL over the student's top k tokens plus a tail, whole distributions: no sampling noise).
    sdpo_form: str = "token"
    sdpo_baseline: str = "none"  # train --sdpo-baseline (token form): none | mean
    sdpo_weight: float = 1.0  # train --sdpo-weight: the text part's weight beside the scored part
    correct: str = "last"  # the corrections arm: correct the last call's ANSWER line, or the first call's CALC line
    # The comments and none arms run `onthejob judge` each round (examples.demo_judge); False: the
    # comments arm learns from self-distillation alone (the runs of docs/demo/comments-trials/).
    judge: bool = True
    seed: int = 0  # which training problems each round draws (0: today's); held-out never changes
    # How each trained version reaches traffic: auto (at once) or gate (its held-out result, posted as
    # its eval, must not be two standard errors below the serving version's; storage/promotion.py).
    # Under gate every round is evaluated: the held-out pass is the candidate's eval.
    promotion: str = "auto"
    flip_reward: tuple[int, ...] = ()  # rounds whose training traffic is graded with the reward's sign flipped
    progress: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DemoConfig:
        """The CLI's ``--rounds --out --model``; anything else keeps its default."""
        fields = cli_fields(cls, args)
        if isinstance(fields.get("flip_reward"), str):
            fields["flip_reward"] = tuple(int(r) for r in fields["flip_reward"].split(",") if r.strip())
        return cls(**fields)


# ---- processes -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def onthejob(*args: str, log: Path | None = None, timeout: float | None = None) -> str:
    """Run ``onthejob ARGS`` to completion; its stdout, or :class:`DemoError` naming the log."""
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if log is not None:
        with log.open("a") as fh:
            fh.write(f"$ onthejob {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        raise DemoError(f"`onthejob {args[0]}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, what: str, log: Path, timeout: float = 120.0) -> None:
    """Poll until ``url`` answers 200; fail early (pointing at the log) if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise DemoError(f"{what} exited with code {proc.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise DemoError(f"{what} did not answer {url} within {timeout:.0f}s; see {log}")


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class Stack:
    """The engine, the database, the proxy and the keys of one demo run; a context manager."""

    def __init__(self, cfg: DemoConfig) -> None:
        self.cfg = cfg
        self.out = cfg.out.resolve()
        self.engine: Any = None
        self.proxy_proc: subprocess.Popen[bytes] | None = None
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        self.project = f"demo-{stamp}"
        self.db_url = cfg.database_url or os.environ.get("DATABASE_URL") or f"sqlite:///{self.out / 'onthejob.db'}"
        self.adapters = self.out / "adapters"  # the trainer files them under <project>/<alias>/vN
        self.proxy_url = ""
        self.upstream = cfg.upstream or ""
        self.model_name = ""
        self.admin_key = self.harness_key = ""
        self.carried: Counter[str] = Counter()  # eval/ungraded counts the previous training run saw
        # The project's judge (examples.demo_judge); with one, each round runs `onthejob judge` before training.
        self.judge_settings = judge_settings(cfg.feedback) if cfg.judge else None

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        from engine.launcher import Engine, EngineConfig
        from engine.weights import resolve_model

        self.out.mkdir(parents=True, exist_ok=True)
        self.adapters.mkdir(parents=True, exist_ok=True)
        info = resolve_model(self.cfg.model)
        self.model_name = info.name
        if not self.upstream:
            say(f"starting the engine ({info.name}, real vLLM) ...")
            cfg = EngineConfig(port=free_port(), threads=self.cfg.engine_threads)
            self.engine = Engine(info, cfg, log=self.out / "engine.log").start()
            self.upstream = self.engine.url
        onthejob("db", "upgrade", "--db", self.db_url, log=self.out / "setup.log")
        port = free_port()
        self.proxy_url = f"http://127.0.0.1:{port}"
        log = self.out / "proxy.log"
        say(f"starting the proxy at {self.proxy_url} (database {self.db_url}) ...")
        with log.open("ab") as fh:
            self.proxy_proc = subprocess.Popen(
                [
                    *CLI,
                    "serve",
                    "--upstream",
                    self.upstream,
                    "--db",
                    self.db_url,
                    "--port",
                    str(port),
                    "--spool",
                    str(self.out / "spool"),
                ],
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_http(f"{self.proxy_url}/readyz", self.proxy_proc, "the proxy", log)
        keys = ("--project", self.project, "--db", self.db_url)
        self.admin_key = onthejob("keys", "create", "--role", "admin", "--name", "demo", *keys).strip()
        self.harness_key = onthejob("keys", "create", "--role", "harness", "--name", "demo-harness", *keys).strip()
        # The alias is the engine's base model name, as `serve` registers it in the default project.
        self.admin("POST", "/v1/admin/aliases", {"name": self.model_name, "base_model": self.model_name})
        if self.judge_settings is not None:  # comments: the model reads them; none: it evaluates itself
            self.admin("PUT", "/v1/admin/project", {"judge": self.judge_settings})
        if self.cfg.promotion != "auto":
            self.admin("PUT", f"/v1/admin/aliases/{self.model_name}/policy", {"mode": self.cfg.promotion})

    def close(self) -> None:
        stop(self.proxy_proc)
        if self.engine is not None:
            self.engine.stop()

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        resp = httpx.request(
            method,
            f"{self.proxy_url}{path}",
            json=body,
            timeout=60,
            headers={"authorization": f"Bearer {self.admin_key}"},
        )
        if resp.status_code >= 400:
            raise DemoError(f"{method} {path} answered {resp.status_code}: {resp.text}")
        return resp.json()

    def deployed_version(self) -> int | None:
        aliases = self.admin("GET", "/v1/admin/aliases")["data"]
        return next((a["deployed_version"] for a in aliases if a["name"] == self.model_name), None)

    def candidate(self) -> int | None:
        """The version waiting for its eval under ``--promotion gate`` (None: none, or auto)."""
        if self.cfg.promotion == "auto":
            return None
        return self.admin("GET", f"/v1/admin/aliases/{self.model_name}/policy")["candidate_version"]  # type: ignore[no-any-return]

    def post_eval(self, version: int | None, heldout: Sequence[EpisodeResult]) -> str | None:
        """The harness's held-out result as the version's eval (per problem, so versions compare paired)."""
        graded = [r for r in heldout if r.outcome != "error"]
        s = summarise(graded)
        path = f"/v1/admin/aliases/{self.model_name}/versions/{version or 'base'}/evals"
        body = {
            "name": "heldout",
            "n": max(s.n, 1),
            "mean": s.mean_reward,
            "stderr": s.stderr,
            "grader": "examples.task.grade",
            "source": "demo harness",
            "scores": {r.problem_id: r.reward for r in graded},
        }
        return self.admin("POST", path, body).get("decision")  # type: ignore[no-any-return]

    def harness(self, model: str | None = None, admin: bool = False, reward_sign: float = 1.0) -> Harness:
        """The harness; ``admin`` with ``model`` ``alias@vN`` evaluates a version that is not routed yet."""
        return Harness(
            HarnessConfig(
                base_url=f"{self.proxy_url}/v1",
                api_key=self.admin_key if admin else self.harness_key,
                model=model or self.model_name,
                feedback_url=f"{self.proxy_url}/v1/feedback",
                feedback=self.cfg.feedback,  # type: ignore[arg-type]
                reward_sign=reward_sign,
                correct=self.cfg.correct,  # type: ignore[arg-type]
            )
        )

    def judge(self, round_no: int) -> str:
        """One pass of ``onthejob judge``: calibrate on the held-out sessions, grade the ungraded ones."""
        out = onthejob(
            "judge",
            "--project",
            self.project,
            "--db",
            self.db_url,
            "--proxy",
            self.proxy_url,
            "--key",
            self.admin_key,
            log=self.out / f"judge-round{round_no}.log",
        )
        return out.strip().splitlines()[-1] if out.strip() else ""

    def train(self, round_no: int) -> None:
        """``onthejob train`` for this round's traffic; it deploys what it trains."""
        log = self.out / f"train-round{round_no}.log"
        argv = [
            *CLI,
            "train",
            "--alias",
            self.model_name,
            "--model",
            self.cfg.model,
            "--project",
            self.project,
            "--db",
            self.db_url,
            "--proxy",
            self.proxy_url,
            "--adapters",
            str(self.adapters),
            "--admin-key",
            self.admin_key,
            "--steps",
            str(self.cfg.train_steps),
            "--batch-size",
            str(self.cfg.batch_size),
            "--lr",
            str(self.cfg.lr),
            # One step per round: the recipe was measured with AdamW's first (sign-like, lr-sized)
            # step each round; continuing the moments made the adapter drift longer (see README).
            "--fresh-optimizer",
        ]
        if self.cfg.feedback in ("comments", "corrections"):
            argv += [
                "--objective",
                "sdpo",
                "--sdpo-form",
                self.cfg.sdpo_form,  # self-distillation and SFT
                "--sdpo-baseline",
                self.cfg.sdpo_baseline,
                "--sdpo-weight",
                str(self.cfg.sdpo_weight),
            ]
        with log.open("ab") as fh:
            # stderr (the trainer's progress bar and step lines) goes to the terminal as well.
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.PIPE, start_new_session=True)
            assert proc.stderr is not None
            try:
                for line in proc.stderr:
                    fh.write(line)
                    fh.flush()
                    if self.cfg.progress:
                        sys.stderr.buffer.write(line)
                        sys.stderr.flush()
                code = proc.wait()
            finally:
                stop(proc)
        if code != 0:
            raise DemoError(f"`onthejob train` failed in round {round_no} ({code}); see {log}")

    def new_exclusions(self) -> dict[str, int]:
        """This round's exclusions. Eval and ungraded trajectories stay available (a grade may still
        come), so every training run counts all of them again; only the increase is this round's."""
        counts = self.exclusions()
        fresh = counts - self.carried
        self.carried = Counter({k: v for k, v in counts.items() if k in CARRIED})
        return dict(fresh)

    def exclusions(self) -> Counter[str]:
        """Trajectories the newest training run left out, by reason (from its recorded steps)."""
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        from storage.db import sync_engine
        from storage.models import TrainingRun, TrainingStep

        engine = sync_engine(self.db_url)
        try:
            with Session(engine) as db:
                run_id = db.scalar(
                    select(TrainingRun.id)
                    .where(TrainingRun.project_id == self.project)
                    .order_by(TrainingRun.id.desc())
                    .limit(1)
                )
                steps = db.scalars(select(TrainingStep).where(TrainingStep.run_id == run_id)).all()
                counts: Counter[str] = Counter()
                for step in steps:
                    counts.update({k: int(v) for k, v in (step.metrics or {}).get("excluded", {}).items()})
                return counts
        finally:
            engine.dispose()


# ---- the rounds ------------------------------------------------------------------------
