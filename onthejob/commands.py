"""Command implementations behind the CLI; each imports what it needs when it runs."""

from __future__ import annotations

import argparse
import os
import time


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def engine(args: argparse.Namespace) -> int:
    from onthejob.engine import Engine, EngineConfig, EngineError
    from onthejob.models import ModelError, resolve_model

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


def serve(args: argparse.Namespace) -> int:
    from proxy.main import run

    return run(args)


def train(args: argparse.Namespace) -> int:
    from trainer.main import run

    return run(args)


def deploy(args: argparse.Namespace) -> int:
    import httpx

    key = args.admin_key or os.environ.get("ONTHEJOB_ADMIN_KEY", "")
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


def demo(args: argparse.Namespace) -> int:
    from examples.demo import run

    return run(args)


def db_upgrade(args: argparse.Namespace) -> int:
    from storage.db import database_url
    from storage.migrate import upgrade

    upgrade(args.db, args.revision)
    print(f"database at {database_url(args.db)} is at {args.revision}")
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


def export(args: argparse.Namespace) -> int:
    from storage.export import run

    return run(args)
