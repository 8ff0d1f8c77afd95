"""Ops routes in one process: /readyz only looks, /metrics and the docs obey their access setting,
the trainer's newest step per alias is on /metrics. The real app, lifespan and Postgres; the stub engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.orm import Session

from proxy.app import create_app
from proxy.settings import Settings
from storage.db import sync_engine
from storage.keys import create_key, ensure_project
from storage.models import TrainingRun, TrainingStep
from tests.proxy.conftest import metric_sample

pytestmark = pytest.mark.anyio
AppFactory = Callable[..., Any]


@pytest.fixture
def in_process(tmp_path: Path, stub_upstream: str, pg_factory: Any) -> AppFactory:
    """An app with its lifespan running, and a client that talks to it without a socket."""
    db_url = pg_factory()

    @asynccontextmanager
    async def start(**settings: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient, str]]:
        defaults = {"auth": False, "reconcile_every_s": 3600.0, "alias_refresh_s": 3600.0, "probe_every_s": 3600.0}
        app = create_app(
            Settings(
                upstreams=[stub_upstream], database_url=db_url, spool_dir=tmp_path / "spool", **{**defaults, **settings}
            )
        )
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                yield app, client, db_url

    return start


async def test_readyz_has_no_side_effects(in_process: AppFactory) -> None:
    async with in_process() as (app, client, _):
        st = app.state.onthejob
        acted: list[str] = []

        async def reconcile(replica: Any) -> int:
            acted.append(f"reconcile {replica.url}")
            return 0

        async def probe(replica: Any) -> None:
            acted.append(f"probe {replica.url}")

        st.router.reconcile, st.router.probe = reconcile, probe
        believed = [r.state(set()) for r in st.router.replicas.replicas]
        for _ in range(3):
            r = await client.get("/readyz")
            assert r.status_code == 200 and r.json()["status"] == "ready", r.text
            assert set(r.json()["upstream"].values()) == {"up"}
            assert [v["state"] for v in r.json()["replicas"].values()] == ["up"]
        assert acted == [] and [r.state(set()) for r in st.router.replicas.replicas] == believed


def _keys(db_url: str) -> dict[str, str]:
    eng = sync_engine(db_url)
    with Session(eng) as db:
        keys = {
            "operator": create_key(db, "default", "admin").secret,
            "harness": create_key(db, "default", "harness").secret,
            "tenant_admin": create_key(db, "tenant", "admin").secret,
        }
        db.commit()
    eng.dispose()
    return keys


@pytest.mark.parametrize("access", ["open", "admin", "off"])
async def test_metrics_and_docs_follow_their_access_setting(in_process: AppFactory, access: str) -> None:
    async with in_process(auth=True, metrics_access=access, docs_access=access) as (_, client, db_url):
        keys = _keys(db_url)
        for path in ("/metrics", "/openapi.json", "/docs", "/redoc"):
            seen = {
                who: (await client.get(path, headers={"authorization": f"Bearer {k}"} if k else {})).status_code
                for who, k in {"anyone": None, **keys}.items()
            }
            expected = {
                "open": {"anyone": 200, "operator": 200, "harness": 200, "tenant_admin": 200},
                "admin": {"anyone": 401, "operator": 200, "harness": 403, "tenant_admin": 403},
                "off": {"anyone": 404, "operator": 404, "harness": 404, "tenant_admin": 404},
            }[access]
            assert seen == expected, path
        assert (await client.get("/healthz")).status_code == 200  # probes stay open whatever the setting


async def test_trainer_step_metrics_are_exported_from_storage(in_process: AppFactory) -> None:
    async with in_process() as (_, client, db_url):
        eng = sync_engine(db_url)
        with Session(eng) as db:
            ensure_project(db, "acme")
            run = TrainingRun(project_id="acme", alias="agent", objective="tis", base_model="m")
            db.add(run)
            db.flush()
            for step, loss in ((1, 0.5), (2, 0.25)):
                metrics = {
                    "loss": loss,
                    "reward_mean": 0.7,
                    "ratio_mean": 1.01,
                    "ratio_max": 1.9,
                    "clipped_frac": 0.02,
                    "ess": 0.93,
                    "kl_mu_pi": 0.004,
                    "tokens": 812,
                    "trajectories": 9,
                    "excluded": {"ungraded": 3, "ratio_out_of_band": 1},
                }
                db.add(TrainingStep(run_id=run.id, step=step, adapter_version=step, metrics=metrics))
            db.commit()
        eng.dispose()
        text = (await client.get("/metrics")).text
        where = {"project": "acme", "alias": "agent"}
        assert metric_sample(text, "onthejob_trainer_step", **where) == 2  # the newest step
        assert metric_sample(text, "onthejob_trainer_loss", **where) == 0.25
        assert metric_sample(text, "onthejob_trainer_ess", **where) == 0.93
        assert metric_sample(text, "onthejob_trainer_adapter_version", **where) == 2
        assert metric_sample(text, "onthejob_trainer_excluded", **where, reason="ungraded") == 3
        assert metric_sample(text, "onthejob_trainer_excluded", **where, reason="ratio_out_of_band") == 1


async def test_a_failed_start_up_step_does_not_skip_the_policies(
    in_process: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start-up step that fails for its own reason (here registering the base aliases) leaves the
    database steps after it to run: the first policy refresh above all, without which the worker
    would refuse every recorded call until its next refresh (an hour in this fixture)."""
    from proxy.routing import Router

    async def broken(self: Router) -> None:
        raise RuntimeError("a bad row")

    monkeypatch.setattr(Router, "register_base_aliases", broken)
    async with in_process() as (app, client, _):
        assert app.state.onthejob.recording.policies.source == "database"
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["policies"] == "database", ready.text
