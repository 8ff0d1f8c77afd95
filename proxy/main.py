"""`onthejob serve`: the proxy on uvicorn with uvloop and httptools."""

from __future__ import annotations

import logging
import os

import uvicorn
from fastapi import FastAPI

from proxy.app import create_app
from proxy.settings import Settings
from storage.migrate import upgrade


def app_from_env() -> FastAPI:
    """The app for each worker process when ``--workers`` > 1 (settings travel in the environment)."""
    return create_app(Settings())


def worker_env(settings: Settings, workers: int) -> dict[str, str]:
    """What each of ``workers`` processes reads its settings from (uvicorn starts them by import path).

    Each worker has its own spool folder (see proxy.spool_folders.claim), so the quota is split
    between them: ``ONTHEJOB_SPOOL_MAX_BYTES`` bounds the proxy's disk use, not one worker's.
    Rate limits are not split here: each worker keeps its own token buckets and leases its share
    of each key's limit through the database with every other worker of every host
    (proxy/ratelimit.py), so the configured limit holds for all hosts together; ``workers`` is
    what a worker's share is before its first lease, and the host id is the same for all of them.
    """
    env = {
        "ONTHEJOB_UPSTREAM": ",".join(settings.upstreams),
        "ONTHEJOB_SPOOL": str(settings.spool_dir),
        "ONTHEJOB_AUTH": "1" if settings.auth else "0",
        "ONTHEJOB_SPOOL_MAX_BYTES": str(settings.spool_max_bytes // workers),
        "ONTHEJOB_RATE_LIMIT_RPS": repr(settings.rate_limit_rps),
        "ONTHEJOB_RATE_LIMIT_BURST": str(settings.rate_limit_burst),
        "ONTHEJOB_HOST_ID": settings.host_id,
        "ONTHEJOB_WORKERS": str(workers),
    }
    if settings.database_url:
        env["DATABASE_URL"] = settings.database_url
    return env


def run(
    settings: Settings, *, host: str = "127.0.0.1", port: int = 8000, workers: int = 1, migrate: bool = True
) -> int:
    """Migrate if the database answers (unless ``migrate`` is false: a migration Job does it, as on
    Kubernetes), then serve until stopped; ``workers`` > 1 runs that many processes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if migrate:
            upgrade(settings.database_url)  # a fresh install answers at once; a no-op when already at head
    except Exception as exc:  # noqa: BLE001 - database down: serve and spool; it drains when it returns
        logging.getLogger("onthejob.proxy").warning("could not migrate the database now (%s); serving anyway", exc)
    server = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        "http": "httptools",
        "log_level": "warning",
        "timeout_graceful_shutdown": 30,
    }
    if workers > 1:
        os.environ.update(worker_env(settings, workers))
        uvicorn.run("proxy.main:app_from_env", factory=True, workers=workers, **server)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(settings), **server)  # type: ignore[arg-type]
    return 0
