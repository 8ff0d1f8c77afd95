"""`onthejob serve`: the proxy on uvicorn with uvloop and httptools."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

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


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    try:
        upgrade(settings.database_url)  # a fresh install answers at once; a no-op when already at head
    except Exception as exc:  # noqa: BLE001 - database down: serve and spool; it drains when it returns
        logging.getLogger("onthejob.proxy").warning("could not migrate the database now (%s); serving anyway", exc)
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        timeout_graceful_shutdown=30,
    )
    return 0
