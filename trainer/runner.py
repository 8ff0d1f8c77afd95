"""``onthejob train``: graded traffic in, LoRA adapter versions out, deployed through the proxy.

Each step: take graded, untrained, non-eval trajectories of the alias from
storage (``storage.feed``: what changed since the trainer's cursor), train one
step on up to ``batch_size`` of them, record the step and which trajectories it
used (with the feedback their rewards came from), save ``<adapters>/<alias>/v<N>``, record the
adapter row, and ask the proxy to deploy it. ``--watch`` keeps polling for new
graded traffic. Under ``torchrun`` rank 0 owns the database (its rows: trainer/run_rows.py) and the proxy; every
rank trains on its shard (see :mod:`trainer.dist`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from storage.deletion import live
from storage.judge_store import JudgeState, judge_state
from storage.models import TrainingRun
from storage.trajectories import Trajectory
from trainer import dist
from trainer import run_rows as rows
from trainer.advantages import TaskBaseline
from trainer.errors import DataError, TrainerError
from trainer.loop import StepResult, train_step
from trainer.policy import Policy, TrainConfig, load_policy
from trainer.publish import deploy, publish
from trainer.settings import TrainSettings
from trainer.textual import Objective, TextualExample
from trainer.textual_load import TextFeed

Loader = Callable[[Session, str, str], tuple[list[Trajectory], Counter[str]]]
# Runs the alias's configured eval on a newly published version (the CLI wires judge.evaluate in); says what it did.
AfterPublish = Callable[[int], str]


def default_loader(settings: TrainSettings) -> Loader:
    """storage's incremental feed: what changed since its cursor, up to ``batch_size`` trajectories a poll.

    With ``--dataset``: that dataset's pinned items, ``batch_size`` a step until none is left.
    """
    if settings.dataset is not None:
        from storage.dataset_load import DatasetFeed
        from storage.datasets import DatasetError

        feed = DatasetFeed(settings.project, settings.alias, settings.dataset, limit=settings.batch_size)

        def load(db: Session, project: str, alias: str) -> tuple[list[Trajectory], Counter[str]]:
            try:
                return feed(db, project, alias)
            except DatasetError as exc:
                raise DataError(f"--dataset: {exc}") from exc

        return load
    try:
        from storage.feed import TrainingFeed
    except ImportError as exc:
        raise DataError("storage.feed.TrainingFeed is missing: this build cannot load traffic") from exc
    return TrainingFeed(settings.project, settings.alias, limit=settings.batch_size, min_batch=settings.min_batch)


def run(settings: TrainSettings, loader: Loader | None = None, after_publish: AfterPublish | None = None) -> int:
    """Entry point of ``onthejob train``; returns the process exit code."""
    try:
        return _run(settings, loader, after_publish)
    except TrainerError as exc:
        print(f"onthejob train: {exc}", file=sys.stderr)
        return 2


def _run(settings: TrainSettings, loader: Loader | None, after_publish: AfterPublish | None = None) -> int:
    from storage.db import sync_engine

    dist.init()
    lead = dist.rank() == 0
    cfg = settings.train_config()
    engine = sync_engine(settings.database_url) if lead else None
    load = loader or (default_loader(settings) if lead else None)
    db = Session(engine) if engine is not None else None
    run_row: TrainingRun | None = None
    try:
        parent_version, parent_path, baseline_state = dist.broadcast(
            rows.resume_point(db, settings) if db is not None else (None, None, None)
        )
        started = time.perf_counter()
        policy = load_policy(cfg, Path(parent_path) if parent_path else None, parent_version)
        if lead:
            parent = f"v{parent_version}" if parent_version else "a fresh LoRA"
            print(
                f"loaded {policy.info.name} + {parent} on {policy.device} in {time.perf_counter() - started:.1f}s",
                file=sys.stderr,
            )
        if db is not None:
            rows.check_lineage(db, settings, policy, parent_version)
            run_row = rows.start_run(db, settings, cfg, policy, parent_version, baseline_state)
        baseline = TaskBaseline.from_dict(baseline_state)
        _loop(settings, cfg, policy, baseline, db, run_row, load, after_publish)
        rows.finish(db, run_row, "finished")
        return 0
    except KeyboardInterrupt:
        rows.finish(db, run_row, "interrupted")
        raise
    except BaseException:
        rows.finish(db, run_row, "failed")
        raise
    finally:
        if db is not None:
            db.close()
        if engine is not None:
            engine.dispose()
        dist.close()


def _loop(
    settings: TrainSettings,
    cfg: TrainConfig,
    policy: Policy,
    baseline: TaskBaseline,
    db: Session | None,
    run_row: TrainingRun | None,
    load: Loader | None,
    after_publish: AfterPublish | None = None,
) -> None:
    from tqdm import tqdm

    lead = db is not None
    steps = settings.steps
    text = None  # sdpo: text-feedback examples, read incrementally like the scored trajectories
    weights: dict[Objective, float] = {"sdpo": settings.sdpo_weight, "correction": settings.correction_weight}
    parts = frozenset(part for part, weight in weights.items() if weight != 0)  # the text parts computed
    if lead and cfg.objective.name == "sdpo" and parts:
        text = TextFeed(
            settings.project,
            settings.alias,
            _tokenizer(policy),
            settings.max_len,
            parts,
            limit=settings.batch_size,
            min_batch=settings.min_batch,
        )
    if lead:
        assert db is not None
        print(judge_line(judge_state(db, settings.project)), file=sys.stderr)
    # The bar and one line per step both go to stderr, where training logs are expected.
    bar = tqdm(total=steps, desc=f"train {settings.alias}", unit="step", disable=not lead, file=sys.stderr)
    done = 0
    waiting = False
    try:
        while steps is None or done < steps:
            started = time.perf_counter()
            batch, textual, pending = dist.broadcast(
                _next_batch(db, settings, load, text) if lead else (None, None, None)
            )
            timings = {"load_s": time.perf_counter() - started}
            if not batch and not textual:
                if lead and not waiting:
                    bar.write(
                        f"no graded trajectories to train on for {settings.alias!r}{_excluded_text(pending)}",
                        sys.stderr,
                    )
                if not settings.watch:
                    return
                waiting = True
                time.sleep(settings.poll_s)
                continue
            waiting = False
            switch = dist.broadcast(rows.serving_parent(db, settings, policy.version) if lead else None)
            if switch is not None:  # the last candidate is held or pending: continue from what serves
                if lead:
                    serving = f"v{switch[0]}" if switch[0] else "the base model"
                    bar.write(f"continuing from {serving} (serving), not v{policy.version} (not promoted)", sys.stderr)
                policy = load_policy(cfg, Path(switch[1]) if switch[1] else None, switch[0])
            adapters = dist.broadcast(rows.adapter_paths(db, settings) if lead else None)
            parent = policy.version
            started = time.perf_counter()
            result = train_step(policy, batch or [], cfg, baseline, adapters, textual or [])
            timings["step_s"] = time.perf_counter() - started
            _merge_counts(result.excluded, pending)  # storage's exclusions join the step's own
            result.metrics["excluded"] = dict(result.excluded)
            version = None
            if lead:
                assert db is not None and run_row is not None
                started = time.perf_counter()
                if result.trained:
                    version = publish(
                        db,
                        policy.model,
                        root=settings.adapters,
                        project_id=settings.project,
                        alias=settings.alias,
                        parent_version=parent,
                        base=policy.info,
                        run_id=run_row.id,
                        metrics=result.metrics,
                        optimizer=policy.optimizer,
                    ).version
                # The step and the trajectories it used are recorded before the deployment,
                # so a refused deployment never makes the next run train on them twice.
                rows.record_step(db, settings, run_row, done + 1, version, result, baseline, batch or [], textual or [])
                timings["publish_s"] = time.perf_counter() - started
                deployed = version is not None and settings.deploy
                status = ""
                if deployed:
                    assert version is not None
                    started = time.perf_counter()
                    answer = deploy(settings.proxy, settings.alias, version, settings.admin_key, candidate=True)
                    status = f" · {_deploy_status(answer)}"
                    timings["deploy_s"] = time.perf_counter() - started
                    if after_publish is not None:  # the alias's configured eval (the CLI wires it)
                        started = time.perf_counter()
                        status += _evaluated(after_publish, version)
                        timings["eval_s"] = time.perf_counter() - started
                took = " ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in timings.items())
                line = summary_line(done + 1, version, result) + status
                bar.write(f"{line} ({took})", sys.stderr)
            version = dist.broadcast(version)
            if result.trained:
                policy.version, policy.dirty = version, version is None
            done += 1
            bar.update(1)
            if not result.trained and not settings.watch:
                return
    finally:
        bar.close()


def _next_batch(
    db: Session | None, settings: TrainSettings, load: Loader | None, text: TextFeed | None = None
) -> tuple[list[Trajectory], list[TextualExample], Counter[str]]:
    """Up to ``batch_size`` trajectories (and, for sdpo, text examples), once ``min_batch`` are waiting.

    Each feed holds its items back until ``min_batch`` wait, so nothing it handed out is dropped here.
    """
    assert db is not None and load is not None
    trajectories, excluded = load(db, settings.project, settings.alias)
    textual: list[TextualExample] = []
    excluded = Counter(excluded)
    if text is not None:
        textual, dropped = text.poll(db)  # a part weighted 0 yields none (the feed counts them: text_weight_zero)
        excluded.update(dropped)
    # A session deleted since its items were read (the delete returned before this step) is not trained on.
    trajectories, gone = live(db, settings.project, trajectories, lambda t: t.session_id, lambda t: t.completion_ids)
    textual, gone_text = live(db, settings.project, textual, lambda e: e.student.session_id, _textual_calls)
    if gone + gone_text:
        excluded["deleted"] += gone + gone_text
    db.rollback()  # end the read transaction: the next poll must see new rows
    if len(trajectories) + len(textual) < settings.min_batch:
        return [], [], excluded
    return list(trajectories[: settings.batch_size]), textual, excluded


def _textual_calls(example: TextualExample) -> list[str]:
    return [*example.student.completion_ids, *(example.teacher.completion_ids if example.teacher else [])]


def _tokenizer(policy: Policy) -> Any:
    """The policy's own tokenizer: its chat template builds the SDPO teacher's context."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy.info.path)


def judge_line(state: JudgeState) -> str:
    """What ``train`` says about the project's judge: whether its grades count, and its agreement."""
    if state.settings is None:
        return "judge: none configured (comments and ungraded sessions give no reward)"
    cal = state.calibration
    agreement = (
        f"rank agreement {cal.spearman:+.2f}, accuracy {cal.accuracy:.2f} on {cal.n}" if cal else "no calibration"
    )
    verdict = "grades count" if state.verdict.accepted else f"grades excluded ({state.verdict.reason})"
    return f"judge {state.settings.fingerprint()}: {agreement}; {verdict}"


def _merge_counts(into: Counter[str], extra: Counter[str] | None) -> None:
    """Add storage's exclusions; "already_used" is bookkeeping, not something this step dropped."""
    for reason, n in (extra or Counter()).items():
        if reason != "already_used":
            into[reason] += n


def _excluded_text(excluded: Counter[str] | None) -> str:
    if not excluded:
        return ""
    return " (excluded: " + ", ".join(f"{k}={v}" for k, v in sorted(excluded.items())) + ")"


def _evaluated(after_publish: AfterPublish, version: int) -> str:
    """The configured eval's one-line result; a failed eval is said, and training goes on (the gate waits)."""
    try:
        said = after_publish(version)
    except Exception as exc:  # noqa: BLE001 - an eval set or grader error must not lose the trained step
        return f" · eval failed: {exc}"
    return f" · {said}" if said else ""


def _deploy_status(answer: dict[str, Any]) -> str:
    """What the proxy did with a published version: deployed (auto), or the policy's candidate status."""
    policy = answer.get("policy", "auto")
    if policy == "auto":
        return "deployed"
    return f"{policy}: {answer.get('status', 'pending')}"


def summary_line(step: int, version: int | None, result: StepResult) -> str:
    """One line per step: what was learnt from, how off-policy it was, where it went."""
    m = result.metrics

    def num(key: str, fmt: str) -> str:
        value = m.get(key)
        return "-" if value is None else format(value, fmt)

    where = f"{'v' + str(version) if version is not None else 'no adapter'}"
    tied = m.get("zero_advantage_trajectories") or 0
    if version is None and not m.get("tokens") and tied:
        where += f" (all {tied} trajectories tied with their group's reward: nothing to learn)"
    return (
        f"step {step} {where}: loss {num('loss', '.4f')} reward {num('reward_mean', '.3f')} "
        f"ratio {num('ratio_mean', '.3f')}/{num('ratio_max', '.3f')} clipped {100 * (m.get('clipped_frac') or 0):.1f}% "
        f"ess {num('ess', '.3f')} kl {num('kl_mu_pi', '.2e')} tokens {m.get('tokens', 0)} "
        f"trajectories {m.get('trajectories', 0)}{_excluded_text(result.excluded)}"
    )
