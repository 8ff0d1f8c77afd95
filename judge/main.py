"""``onthejob judge [--watch]``: the judge as its own process (a compose service beside the trainer).

Each pass reads the project's judge settings and sessions from the database,
calibrates on the labelled sessions, judges the rest and posts the grades
through the proxy. The judge model defaults to the project's served model
through the proxy itself (its calls tagged ``judge``, never trained on); a
``base_url`` in the settings points it elsewhere, with its key read from the
environment variable ``api_key_env`` names.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from judge.client import JudgeClient
from judge.errors import JudgeError
from judge.post import post_feedback
from judge.run import Report, judge_once, project_judge
from storage.judge_config import JudgeSettings
from storage.models import Alias


@dataclass(frozen=True)
class JudgeCommand:
    """What ``onthejob judge`` was asked to do (built by the CLI from flags and environment)."""

    db_url: str
    project: str = "default"
    proxy: str = "http://127.0.0.1:8000"
    api_key: str | None = None  # a key of the project: posts feedback, and calls the judge through the proxy
    alias: str | None = None  # judge only this alias's sessions
    watch: bool = False
    poll_s: float = 30.0
    calibrate: bool = True
    dry_run: bool = False


def judge_model(db: DbSession, project: str, cfg: JudgeSettings, alias: str | None) -> str:
    """The model the judge asks: the configured one, else the alias judged, else the project's first alias."""
    if cfg.model:
        return cfg.model
    if alias:
        return alias
    name = db.scalar(select(Alias.name).where(Alias.project_id == project).order_by(Alias.id).limit(1))
    if name is None:
        raise JudgeError(f"project {project!r} has no alias to judge with: set judge.model")
    return name


def client_for(cmd: JudgeCommand, cfg: JudgeSettings, model: str) -> JudgeClient:
    """Through the proxy by default (tagged judge), or the configured endpoint with its own key."""
    if cfg.base_url is None:
        return JudgeClient(cmd.proxy.rstrip("/") + "/v1", model, api_key=cmd.api_key)
    key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    if cfg.api_key_env and not key:
        raise JudgeError(f"judge.api_key_env names {cfg.api_key_env}, which is not set in this environment")
    return JudgeClient(cfg.base_url, model, api_key=key)


async def one_pass(cmd: JudgeCommand, db: DbSession) -> Report:
    """Read the settings afresh (the operator may have changed the rubric), then one :func:`judge_once`."""
    cfg, _ = project_judge(db, cmd.project)
    model = judge_model(db, cmd.project, cfg, cmd.alias)

    async def post(items: Sequence[dict[str, Any]]) -> int:
        return await post_feedback(cmd.proxy, cmd.api_key, items)

    async with client_for(cmd, cfg, model) as client:
        return await judge_once(
            db, cmd.project, client, post, alias=cmd.alias, calibrate_first=cmd.calibrate, dry_run=cmd.dry_run
        )


def run(cmd: JudgeCommand) -> int:
    """Entry point; prints one JSON line per pass. Exit 2 on a configuration or endpoint error (once only)."""
    from storage.db import sync_engine

    engine = sync_engine(cmd.db_url)
    try:
        while True:
            try:
                with DbSession(engine) as db:
                    report = asyncio.run(one_pass(cmd, db))
                print(json.dumps(report.to_dict()), flush=True)
            except JudgeError as exc:
                print(f"onthejob judge: {exc}", file=sys.stderr, flush=True)
                if not cmd.watch:
                    return 2
            if not cmd.watch:
                return 0
            time.sleep(cmd.poll_s)  # --watch: a missing judge or a down endpoint is waited out, not fatal
    finally:
        engine.dispose()
