"""The proxy's event loop while background work runs: its lag during dataset creation and a retention pass.

A probe task sleeps 5 ms again and again on the loop and records how late it wakes (the lag every
call in flight would see at that moment). Measured while, on the same loop:

- a dataset of ``--dataset-sessions`` sessions (four turns each, graded) is created, and
- a retention pass deletes ``--retention-calls`` calls (with their sessions, feedback and change-log entries),

- a deployment is made while one of two engines hangs in ``load_lora_adapter`` (bench/stub_upstream.py
  ``--hang-loads``), and a second worker (another app on the same database) follows the alias table,

each done the way the code did before (``before``: the route's ``db.run_sync`` on the loop's async session,
the proxy's housekeeping coroutine's ``run_sync(apply_retention)``) and the way it does now (``after``: the
real ``POST /v1/admin/datasets`` route, which works in the worker's dataset process (storage/dataset_jobs.py),
and the retention pass in a process of its own, ``onthejob retention``, as the ``onthejob housekeep`` process
that ``serve`` starts beside its workers runs it). For the deployment, ``before``
waits for every engine's load (as ``Router.stage`` did, here with a 10 s load timeout instead of 120 s) and
``after`` answers once one engine has the version and the rest had ``STAGE_GRACE_S``; both print how long
the deploy route took and how long after its answer the second worker routed to the version. The history
is written by COPY (bench/loader_scale.py's fill, the recorder's bulk path) into a database made afresh for
each mode.

Mode ``together`` (the issue's measure): all three at once on worker A's loop, the dataset, the retention
pass (over the calls older than the dataset's, which are made recent for it) and the deployment with a
hung engine, with the lag probe beside them.

Run: ``python -m bench.serving_under_load [--dataset-sessions 10000] [--retention-calls 100000]
[--modes before,after,together]``. Prints one JSON object per line (lag p50/p99/max in ms, seconds taken).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import orjson
from aiohttp.test_utils import TestServer
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from bench import stub_upstream
from bench.loader_scale import PROJECT, T0, TURNS, fill
from proxy.app import create_app
from proxy.settings import Settings
from storage import datasets
from storage.db import async_engine, sync_engine
from storage.migrate import upgrade
from storage.models import Adapter, Completion, Project
from storage.retention import apply_retention

PROBE_S = 0.005


async def lag_during(work: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """Run ``work`` on this loop with the lag probe beside it; the probe's percentiles in ms."""
    lags: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            at = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            lags.append((time.perf_counter() - at - PROBE_S) * 1000)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.05)  # the probe is running
    started = time.perf_counter()
    await work()
    seconds = time.perf_counter() - started
    done.set()
    await task
    lags.sort()

    def pct(q: float) -> float:  # nearest rank: a lag that was seen, never one extrapolated past the max
        return round(lags[min(len(lags) - 1, max(0, math.ceil(q * len(lags)) - 1))], 2)

    return {
        "seconds": round(seconds, 2),
        "lag_ms_p50": pct(0.5),
        "lag_ms_p99": pct(0.99),
        "lag_ms_max": round(lags[-1], 2),
        "probes": len(lags),
    }


def fresh(admin_url: str, name: str) -> str:
    admin = create_engine(make_url(admin_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return url


def keep_one_day(url: str) -> None:
    eng = sync_engine(url)
    with Session(eng) as db:
        db.execute(update(Project).where(Project.id == PROJECT).values(settings={"retention_days": 1}))
        db.commit()
    eng.dispose()


async def before(url: str, since: str) -> dict[str, Any]:
    """The old paths, on the loop: the dataset route's ``run_sync`` and the housekeeping coroutine's pass."""
    eng = async_engine(url)
    out: dict[str, Any] = {}

    async def create() -> None:
        async with AsyncSession(eng, expire_on_commit=False) as db:
            spec = datasets.Spec(datasets.DatasetFilter.from_dict({"since": since}))
            made = await db.run_sync(lambda s: datasets.create(s, PROJECT, "ds", spec))
            await db.commit()
            out["dataset_trajectories"] = made["counts"]["trajectories"]

    async def retention() -> None:
        async with AsyncSession(eng, expire_on_commit=False) as db:
            done = await db.run_sync(lambda s: apply_retention(s))
            out["deleted_calls"] = done[PROJECT]["calls"]

    out["dataset"] = await lag_during(create)
    keep_one_day(url)
    out["retention"] = await lag_during(retention)
    await eng.dispose()
    return out


async def after(url: str, since: str) -> dict[str, Any]:
    """The new paths: the real route (the dataset process) and retention in a process of its own."""
    out: dict[str, Any] = {}
    with TemporaryDirectory() as spool:
        settings = Settings(
            upstreams=["http://127.0.0.1:1"],
            database_url=url,
            auth=False,
            housekeep=False,
            default_project=PROJECT,
            spool_dir=Path(spool),
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=600) as client:

                async def create() -> None:
                    made = await client.post("/v1/admin/datasets", json={"name": "ds", "filter": {"since": since}})
                    assert made.status_code == 201, made.text
                    out["dataset_trajectories"] = made.json()["counts"]["trajectories"]

                out["dataset"] = await lag_during(create)
            keep_one_day(url)

            async def retention() -> None:
                out["deleted_calls"] = await retention_process(url)

            out["retention"] = await lag_during(retention)
    return out


async def retention_process(url: str) -> int:
    """One retention pass as ``serve``'s housekeeping process runs it: ``onthejob retention`` in a process of
    its own (sharing nothing with this loop but the cores); the calls it deleted in the bench's project."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "onthejob.cli", "retention", "--db", url, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    said = re.search(rf"project {re.escape(PROJECT)}: deleted (\d+) calls", err.decode())
    assert said is not None, err.decode()
    return int(said.group(1))


LOAD_TIMEOUT_S = 10.0


async def deployment(url: str, mode: str, since: str | None = None) -> dict[str, Any]:
    """Deploy ``x@v1`` through worker A while one engine hangs in its load; when does worker B route to it?

    ``since`` (mode ``together``): meanwhile, on worker A, the dataset route makes a dataset of the calls
    since then and the housekeeper's retention job deletes the older ones, all three at once."""
    eng = sync_engine(url)
    with Session(eng) as db:
        db.add(
            Adapter(
                project_id=PROJECT,
                alias="x",
                version=1,
                path="/adapters/x/v1",
                sha256="0" * 64,
                base_model=stub_upstream.MODEL,
            )
        )
        db.commit()
    eng.dispose()
    hung, good = TestServer(stub_upstream.make_app(hang_loads=True)), TestServer(stub_upstream.make_app())
    await hung.start_server()
    await good.start_server()
    urls = [str(hung.make_url("")).rstrip("/"), str(good.make_url("")).rstrip("/")]
    stub_upstream.ADAPTERS.clear()
    out: dict[str, Any] = {}
    with TemporaryDirectory() as spool_a, TemporaryDirectory() as spool_b:
        apps = [
            create_app(
                Settings(
                    upstreams=urls,
                    database_url=url,
                    auth=False,
                    housekeep=False,
                    default_project=PROJECT,
                    spool_dir=Path(spool),
                )
            )
            for spool in (spool_a, spool_b)
        ]
        async with apps[0].router.lifespan_context(apps[0]), apps[1].router.lifespan_context(apps[1]):
            a, b = (app.state.onthejob.router for app in apps)
            for router in (a, b):
                router.load_timeout_s = LOAD_TIMEOUT_S
                if mode == "before":
                    router.stage_grace_s = LOAD_TIMEOUT_S * 2  # waits for every load, as before
            transport = httpx.ASGITransport(app=apps[0])
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=600) as client:
                answered: list[float] = []

                async def deploy() -> None:
                    made = await client.post("/v1/admin/deployments", json={"alias": "x", "version": 1})
                    assert made.status_code == 201, made.text
                    answered.append(time.perf_counter())
                    out["replicas"] = sorted(made.json()["replicas"].values())
                    while b.deployed(PROJECT, "x") != 1:
                        await asyncio.sleep(0.01)
                    out["worker_b_follows_s"] = round(time.perf_counter() - answered[0], 2)

                if since is None:
                    out["deploy"] = await lag_during(deploy)
                else:

                    async def create() -> None:
                        body = {"name": "ds", "filter": {"since": since}}
                        made = await client.post("/v1/admin/datasets", json=body)
                        assert made.status_code == 201, made.text
                        out["dataset_trajectories"] = made.json()["counts"]["trajectories"]

                    async def retention() -> None:
                        out["deleted_calls"] = await retention_process(url)

                    async def timed(name: str, work: Callable[[], Awaitable[None]]) -> None:
                        started = time.perf_counter()
                        await work()
                        out[f"{name}_s"] = round(time.perf_counter() - started, 2)

                    out["all_three"] = await lag_during(
                        lambda: asyncio.gather(timed("dataset", create), timed("retention", retention), deploy())
                    )
    await hung.close()
    await good.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="onthejob_bench_serving")
    parser.add_argument("--dataset-sessions", type=int, default=10_000)
    parser.add_argument("--retention-calls", type=int, default=100_000)
    parser.add_argument("--modes", default="before,after")
    args = parser.parse_args()
    sessions = max(args.dataset_sessions, args.retention_calls // TURNS)
    # Session s's calls are at s * 10 ms: the dataset takes the newest --dataset-sessions of them.
    since = (T0 + timedelta(milliseconds=(sessions - args.dataset_sessions) * 10)).isoformat()
    for mode in args.modes.split(","):
        if mode == "together":  # retention passes over --retention-calls older than the dataset's sessions
            sessions = args.retention_calls // TURNS + args.dataset_sessions
        url = fresh(args.admin, args.database)
        fill_s = asyncio.run(fill(url, 0, sessions))
        eng = sync_engine(url)
        with Session(eng) as db:
            calls = db.scalar(select(func.count()).select_from(Completion))
        eng.dispose()
        idle = asyncio.run(lag_during(lambda: asyncio.sleep(2)))
        if mode == "together":
            # The dataset's sessions made recent, so that retention (one day) deletes only the others.
            recent = datetime.now(UTC) - timedelta(hours=1)
            cut = T0 + timedelta(milliseconds=(sessions - args.dataset_sessions) * 10)
            eng = sync_engine(url)
            with Session(eng) as db:
                shift = recent - cut
                db.execute(
                    update(Completion)
                    .where(Completion.created_at >= cut)
                    .values(created_at=Completion.created_at + shift)
                )
                db.commit()
            eng.dispose()
            keep_one_day(url)
            result = {"together": asyncio.run(deployment(url, "after", since=recent.isoformat()))}
        else:
            result = asyncio.run((before if mode == "before" else after)(url, since))
            result["deployment_with_a_hung_engine"] = asyncio.run(deployment(url, mode))
        print(
            orjson.dumps({"mode": mode, "calls": calls, "fill_s": round(fill_s, 1), "idle": idle, **result}).decode(),
            flush=True,
        )


if __name__ == "__main__":
    main()
