"""The talk's two failures through a real proxy, with the documented default thresholds (bench/talk_cases.py).

Each scenario's harness is seeded, so which tool calls fail, how long each answer is and which
sessions flood are the same on every run; only the engine's text differs. Alerts surface in
``GET /v1/admin/alerts``, ``/metrics`` and ``storage.alerts.open_alerts``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.pool import NullPool

from bench.talk_cases import Phase, prepare, simulate, zero_adapter
from engine.launcher import Engine
from onthejob.monitor import DriftProbe
from storage.alerts import open_alerts
from storage.db import async_engine
from tests.proxy.conftest import ProxyFactory, metric_sample

pytestmark = pytest.mark.anyio
# Sessions per phase: the default min_sessions, so each version is compared as soon as it can be. They run
# 20 at once (the engine batches them) and the monitors run once, at each phase's end.
SESSIONS = 20


@pytest.fixture
async def maker(pg_factory: object) -> AsyncIterator[tuple[str, async_sessionmaker[AsyncSession]]]:
    url: str = pg_factory()  # type: ignore[operator]
    eng = async_engine(url, poolclass=NullPool)
    yield url, async_sessionmaker(eng, expire_on_commit=False)
    await eng.dispose()


async def test_the_talks_two_failures_raise_alerts_on_every_surface_a_clean_version_none(
    start_proxy: ProxyFactory, tiny_engine: Engine, maker: tuple[str, async_sessionmaker[AsyncSession]],
    tmp_path: Path,
) -> None:  # fmt: skip
    url, sm = maker
    await prepare(sm, "default", tiny_engine.model.name, str(zero_adapter(tiny_engine.model.path, tmp_path / "zero")))
    proxy = start_proxy(tiny_engine.url, url)
    phases = [
        Phase(None),
        Phase(1),  # as clean as the base model: must raise nothing
        Phase(2, answer=0.6, tool_fail=0.1),  # case 1: 10 % tool failures, answers 40 % shorter
        Phase(3, answer=0.6, tool_fail=0.1, flood=0.5),  # case 2: half the sessions flood tool calls
    ]
    run = await simulate("talk", 5, proxy.url, sm, "default", SESSIONS, phases=phases, batch=SESSIONS)
    alerts = {(a["monitor"], a["version"]) for a in run.opened}
    assert not any(v in (None, 1) for _, v in alerts), run.opened
    assert ("answer_tokens", 2) in alerts and run.delay("answer_tokens", 2) == SESSIONS, run.opened
    tool_errors = run.delay("tool_error_rate", 2)
    assert tool_errors is not None and tool_errors <= 2 * SESSIONS, run.opened
    assert {("timeout_rate", 3), ("tool_calls_per_session", 3)} <= alerts, run.opened
    assert run.delay("timeout_rate", 3) == SESSIONS

    # Every surface: the admin API, /metrics, and the function promotion holds on.
    listed = httpx.get(f"{proxy.url}/v1/admin/alerts", params={"alias": "agent"}).json()["data"]
    assert {(a["name"], a["version"]) for a in listed} == alerts
    metrics = httpx.get(f"{proxy.url}/metrics").text
    labels = {"project": "default", "alias": "agent", "version": "3", "kind": "monitor", "check": "timeout_rate"}
    assert metric_sample(metrics, "onthejob_alerts_open", **labels) == 1.0
    async with sm() as db:
        assert "timeout_rate" in {a.name for a in await open_alerts(db, "default", "agent", 3)}
        assert await open_alerts(db, "default", "agent", 1) == []
    bad = httpx.put(f"{proxy.url}/v1/admin/aliases/agent/monitors", json={"thresholds": {"nope": {"size": 1}}})
    assert bad.status_code == 400 and "nope" in bad.text  # an override names what it changes
    first = listed[-1]
    assert httpx.post(f"{proxy.url}/v1/admin/alerts/{first['id']}/resolve").json()["status"] == "resolved"
    async with sm() as db:
        assert all(a.id != first["id"] for a in await open_alerts(db, "default", "agent", None))

    # Drift from the base model: every version here is a zero adapter, the base model's weights, so
    # KL(π_v ‖ π_base) is 0 up to what min_tokens does to μ (it renormalises without end-of-turn).
    async with sm() as db:
        drift = await DriftProbe(tiny_engine.url, sample=4).estimates(db, "default", "agent")
    assert set(drift) == {None, 1, 2, 3}
    assert all(abs(e.value) < 0.05 and e.n == 4 for e in drift.values()), drift
