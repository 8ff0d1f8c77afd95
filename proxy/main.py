"""`onthejob serve`: the proxy on uvicorn with uvloop and httptools."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from proxy.app import create_app
from proxy.settings import Settings
from storage.migrate import upgrade


def settings_from_args(args: argparse.Namespace) -> Settings:
    kwargs: dict[str, object] = {"database_url": args.db, "auth": not args.no_auth}
    if args.upstream:
        kwargs["upstreams"] = [u for item in args.upstream for u in item.split(",")]
    if args.spool:
        kwargs["spool_dir"] = Path(args.spool)
    return Settings(**kwargs)  # type: ignore[arg-type]


def app_from_env() -> FastAPI:
    """The app for each worker process when ``--workers`` > 1 (settings travel in the environment)."""
    return create_app(Settings())


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    try:
        upgrade(settings.database_url)  # a fresh install answers at once; a no-op when already at head
    except Exception as exc:  # noqa: BLE001 - database down: serve and spool; it drains when it returns
        logging.getLogger("onthejob.proxy").warning("could not migrate the database now (%s); serving anyway", exc)
    server = {"host": args.host, "port": args.port, "loop": "uvloop", "http": "httptools", "log_level": "warning",
              "timeout_graceful_shutdown": 30}  # fmt: skip
    if args.workers > 1:
        # Each worker is its own process with its own spool folder (see proxy.spool.claim).
        os.environ.update({"ONTHEJOB_UPSTREAM": ",".join(settings.upstreams), "ONTHEJOB_SPOOL": str(settings.spool_dir),
                           "ONTHEJOB_AUTH": "1" if settings.auth else "0"})  # fmt: skip
        if settings.database_url:
            os.environ["DATABASE_URL"] = settings.database_url
        uvicorn.run("proxy.main:app_from_env", factory=True, workers=args.workers, **server)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(settings), **server)  # type: ignore[arg-type]
    return 0
