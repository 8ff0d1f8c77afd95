"""Command implementations behind the CLI; each imports what it needs when it runs."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.settings import Settings as ProxySettings
    from trainer.settings import TrainSettings


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def engine(args: argparse.Namespace) -> int:
    from engine.launcher import Engine, EngineConfig, EngineError
    from engine.weights import ModelError, resolve_model

    try:
        model = resolve_model(args.model)
    except ModelError as exc:
        raise UserError(str(exc)) from exc
    cfg = EngineConfig(
        port=args.port,
        host=args.host,
        threads=args.threads,
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
    )
    eng = Engine(model, cfg)
    started = time.monotonic()
    try:
        eng.start()
    except EngineError as exc:
        raise UserError(str(exc)) from exc
    took = time.monotonic() - started
    print(f"engine ready in {took:.0f}s: {eng.url}/v1  model={model.name}  sha256={model.sha256[:12]}")
    try:
        assert eng.proc is not None
        return eng.proc.wait()
    finally:
        eng.stop()


def admin_key(flag: str | None) -> str | None:
    """``--admin-key``, else ``ONTHEJOB_ADMIN_KEY``: the one place the CLI's commands read it."""
    return flag or os.environ.get("ONTHEJOB_ADMIN_KEY") or None


def proxy_settings(args: argparse.Namespace) -> ProxySettings:
    """``onthejob serve``'s flags over the proxy's own environment defaults (see proxy.settings)."""
    from proxy.settings import Settings

    kwargs: dict[str, Any] = {"database_url": args.db, "auth": not args.no_auth}
    if getattr(args, "no_housekeep", False):
        kwargs["housekeep"] = False
    if args.upstream:
        kwargs["upstreams"] = [u for item in args.upstream for u in item.split(",")]
    if args.spool:
        kwargs["spool_dir"] = Path(args.spool)
    if getattr(args, "host_id", None):
        kwargs["host_id"] = args.host_id
    try:
        return Settings(**kwargs)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def serve(args: argparse.Namespace) -> int:
    from proxy.main import run

    if args.workers < 1:
        raise UserError(f"--workers {args.workers}: must be at least 1")
    settings = proxy_settings(args)
    # The workers never run the housekeeping themselves (their GIL is the serving loop's): unless told
    # --no-housekeep, one `onthejob housekeep` process beside them does, on the proxy's schedule.
    os.environ["ONTHEJOB_HOUSEKEEP"] = "0"  # the processes of --workers N build their settings from the environment
    keeper = housekeep_process(settings) if settings.housekeep else None
    try:
        return run(
            dataclasses.replace(settings, housekeep=False),
            host=args.host,
            port=args.port,
            workers=args.workers,
            migrate=not args.no_migrate,
        )
    finally:
        if keeper is not None:
            keeper.terminate()
            keeper.stdin.close()  # type: ignore[union-attr]
            try:
                keeper.wait(timeout=15)  # a job under way finishes its transaction first
            except subprocess.TimeoutExpired:
                keeper.kill()


def housekeep_process(settings: ProxySettings) -> subprocess.Popen[bytes]:
    """``onthejob housekeep`` as a child of ``serve``: it ends when serve does, killed or not, since it
    stops when its stdin (a pipe only serve holds) closes."""
    every = str(settings.retention_every_s)
    cmd = [sys.executable, "-m", "onthejob.cli", "housekeep"]
    cmd += ["--db", str(settings.database_url), "--sweep-every", str(settings.reconcile_every_s)]
    cmd += ["--retention-every", every, "--prune-every", every, "--until-stdin-closes"]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE)


def train_settings(args: argparse.Namespace) -> TrainSettings:
    """``onthejob train``'s flags and environment as the trainer's one validated settings object."""
    from storage.db import database_url
    from trainer.settings import SettingsError, TrainSettings

    try:
        return TrainSettings(
            alias=args.alias,
            database_url=database_url(args.db),
            model=args.model,
            project=args.project,
            objective=args.objective,
            lr=args.lr,
            batch_size=args.batch_size,
            min_batch=args.min_batch,
            max_len=args.max_len,
            threads=args.threads,
            fresh_optimizer=args.fresh_optimizer,
            parent=str(args.parent),
            steps=args.steps if args.steps is not None else (None if args.watch or args.dataset else 1),
            watch=args.watch,
            dataset=args.dataset,
            poll_s=args.poll,
            adapters=Path(args.adapters),
            proxy=args.proxy,
            admin_key=admin_key(args.admin_key),
            deploy=not args.no_deploy,
            sdpo_weight=args.sdpo_weight,
            correction_weight=args.correction_weight,
            sdpo_form=args.sdpo_form,
            sdpo_baseline=args.sdpo_baseline,
            sdpo_teacher=args.sdpo_teacher,
            sdpo_ema=args.sdpo_ema,
            sdpo_signal_clip=args.sdpo_signal_clip,
            sdpo_kl=args.sdpo_kl,
            step_floor=args.step_floor,
        )
    except SettingsError as exc:
        raise UserError(str(exc)) from exc


def train(args: argparse.Namespace) -> int:
    from judge.evaluate import after_publish
    from trainer.runner import run

    settings = train_settings(args)
    # After each published version, the alias's configured eval (its promotion policy's), if any.
    hook = after_publish(settings.proxy, settings.admin_key, settings.alias, settings.project, settings.database_url)
    return run(settings, after_publish=hook if settings.deploy else None)


def evaluate(args: argparse.Namespace) -> int:
    """``onthejob eval``: one version, one eval set or replayed tag, one grader; stored per version."""
    import httpx

    from judge.evaluate import EvalSpec, evaluate, list_evals, plot, table
    from judge.graders import GraderError
    from storage.db import database_url
    from storage.export import parse_since

    key = admin_key(args.admin_key)
    since = since_flag(args.since, parse_since)
    version: int | None
    if args.version is None:  # the serving version
        aliases = httpx.get(f"{args.proxy}/v1/admin/aliases", headers={"authorization": f"Bearer {key}"}, timeout=30)
        if aliases.status_code != 200:
            raise UserError(f"cannot read the alias from the proxy ({aliases.status_code}): {aliases.text[:200]}")
        version = next((a["deployed_version"] for a in aliases.json()["data"] if a["name"] == args.alias), None)
    elif args.version == "base":
        version = None
    elif args.version.isdigit():
        version = int(args.version)
    else:
        raise UserError(f"--version {args.version!r}: a version number or 'base'")
    name = args.name or (Path(args.set).stem if args.set else f"tag-{args.tag}")
    spec = EvalSpec(
        alias=args.alias,
        version=version,
        proxy=args.proxy,
        key=key,
        grader=args.grader,
        name=name,
        set_path=Path(args.set) if args.set else None,
        tag=args.tag,
        since=since,
        project=args.project,
        db_url=database_url(args.db) if (args.tag or args.grader == "judge") else None,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        limit=args.limit,
        post=not args.no_post,
    )
    try:
        result, answer = evaluate(spec)
    except GraderError as exc:
        raise UserError(str(exc)) from exc
    print(
        f"{spec.model} on {name!r} ({args.grader}): {result.mean:.4f} ± {result.stderr:.4f} over {result.n} items"
        f"{f', {len(result.ungraded)} ungraded' if result.ungraded else ''}"
    )
    if answer is not None:
        if answer.get("decision"):
            print(f"promotion: {answer['decision']}")
        rows = list_evals(args.proxy, key, args.alias, ["base", *[str(v) for v in range(1, (version or 0) + 1)]])
        print(table(rows, name))
        if args.plot:
            print(f"wrote {plot(rows, name, args.alias, Path(args.plot))}")
    return 0


def deploy(args: argparse.Namespace) -> int:
    import httpx

    key = admin_key(args.admin_key) or ""
    version = None if args.version == "base" else int(args.version)
    resp = httpx.post(
        f"{args.proxy}/v1/admin/deployments",
        json={"alias": args.alias, "version": version},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    if resp.status_code >= 400:
        raise UserError(f"deploy failed ({resp.status_code}): {resp.text}")
    print(resp.text)
    return 0


def monitor(args: argparse.Namespace) -> int:
    from onthejob.monitor import MonitorCommand, run
    from storage.db import database_url

    if args.interval <= 0 or args.drift_sample < 1:
        raise UserError("--interval must be positive and --drift-sample at least 1")
    return run(
        MonitorCommand(
            db_url=database_url(args.db),
            project=args.project,
            alias=args.alias,
            watch=args.watch,
            interval_s=args.interval,
            drift_engine=args.drift_engine,
            drift_sample=args.drift_sample,
            as_json=args.json,
        )
    )


def demo(args: argparse.Namespace) -> int:
    if getattr(args, "jobs", "one") == "two":
        from examples import jobs_two
        from judge import evaluate as judge_evaluate

        return jobs_two.run(args, judge_evaluate)
    from examples.demo import run

    return run(args)


def db_upgrade(args: argparse.Namespace) -> int:
    from storage.db import database_url, masked
    from storage.migrate import upgrade

    upgrade(args.db, args.revision)
    print(f"database at {masked(database_url(args.db))} is at {args.revision}")  # never its password
    return 0


def db_downgrade(args: argparse.Namespace) -> int:
    from storage.migrate import downgrade

    downgrade(args.db, args.revision)
    return 0


def keys_create(args: argparse.Namespace) -> int:
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.keys import create_key

    eng = sync_engine(args.db)
    with Session(eng) as db:
        key = create_key(db, args.project, args.role, args.name)
        db.commit()
    print(key.secret)
    return 0


def since_flag(text: str | None, parse: Any) -> Any:
    """``--since``, parsed by ``storage.export.parse_since``, or a :class:`UserError` naming the flag."""
    try:
        return parse(text)
    except ValueError as exc:
        raise UserError(f"--since {text!r} is not an ISO time, e.g. 2026-11-30T12:00") from exc


def judge(args: argparse.Namespace) -> int:
    from judge.main import JudgeCommand, run
    from storage.db import database_url

    if args.poll < 0:
        raise UserError(f"--poll {args.poll}: must be 0 or more seconds")
    return run(
        JudgeCommand(
            db_url=database_url(args.db),
            project=args.project,
            proxy=args.proxy,
            api_key=args.key or os.environ.get("ONTHEJOB_JUDGE_KEY") or os.environ.get("ONTHEJOB_ADMIN_KEY"),
            alias=args.alias,
            watch=args.watch,
            poll_s=args.poll,
            calibrate=not args.no_calibrate,
            dry_run=args.dry_run,
        )
    )
