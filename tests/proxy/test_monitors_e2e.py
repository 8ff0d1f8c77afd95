"""The talk's two failures through a real proxy, with the documented default thresholds (bench/talk_cases.py).

Each scenario's harness is seeded, so which tool calls fail, how long each answer is and which
sessions flood are the same on every run. Alerts surface in ``GET /v1/admin/alerts``, ``/metrics``
and ``storage.alerts.open_alerts``. The scenario runs on the stub engine (~430 calls: on the real
tiny engine it took 6-7 minutes on the shared 2-core machine); the real engine checks what the
stub cannot show: a flooded session cut by the harness is recorded as timed out, and the drift probe.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.pool import NullPool

from bench.talk_cases import prepare, simulate
from bench.talk_harness import Harness
from bench.talk_scenarios import EVAL, Phase
from engine.launcher import Engine
from onthejob.monitor import DriftProbe
from storage.alerts import open_alerts
from storage.db import async_engine
from storage.grading import DEFAULT_RULE
from storage.monitor_store import load_window
from storage.monitors import parse_config
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
    start_proxy: ProxyFactory, stub_upstream: str, maker: tuple[str, async_sessionmaker[AsyncSession]]
) -> None:
    url, sm = maker
    await prepare(sm, "default", "stub-model", "/no-weights")
    proxy = start_proxy(stub_upstream, url)
    phases = [
        Phase(None),
        Phase(1),  # as clean as the base model: must raise nothing
        Phase(2, answer=0.6, tool_fail=0.1),  # case 1: 10 % tool failures, answers 40 % shorter
        Phase(3, answer=0.6, tool_fail=0.1, flood=0.5),  # case 2: half the sessions flood tool calls
    ]
    run = await simulate("talk", 5, proxy.url, sm, "default", SESSIONS, phases=phases, batch=SESSIONS, stub=True)
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


async def test_a_drifting_version_is_held_under_gate_and_rolled_back_under_canary_because_of_its_alert(
    start_proxy: ProxyFactory, stub_upstream: str, maker: tuple[str, async_sessionmaker[AsyncSession]]
) -> None:
    url, sm = maker
    proxy = start_proxy(stub_upstream, url, env={"ONTHEJOB_PROMOTION_EVERY": "86400"})  # decisions when asked
    for alias in ("gated", "canaried"):
        await prepare(sm, "default", "stub-model", "/no-weights", alias=alias)

    # gate: v1 answers 40 % shorter, but its eval equals the base model's (the drift does not show in it): promoted,
    # it serves, and the monitors see it. v2, trained from it, is held as it is published.
    shorter = [Phase(None), Phase(1, answer=0.6)]
    gated = await simulate(
        "gate",
        5,
        proxy.url,
        sm,
        "default",
        SESSIONS,
        phases=shorter,
        alias="gated",
        batch=SESSIONS,
        stub=True,
        policy="gate",
    )
    assert [(d.version, d.decision, d.served) for d in gated.decisions] == [(1, "promoted", 0)]
    assert ("answer_tokens", 1) in {(a["monitor"], a["version"]) for a in gated.opened}, gated.opened
    submit = {"alias": "gated", "version": 2, "candidate": True}
    assert httpx.post(f"{proxy.url}/v1/admin/deployments", json=submit).json()["status"] == "held"
    assert httpx.post(f"{proxy.url}/v1/admin/aliases/gated/versions/2/evals", json=EVAL).json()["decision"] is None
    held = httpx.get(f"{proxy.url}/v1/admin/aliases/gated/promotions").json()["data"][-1]
    assert (held["version"], held["decision"]) == (2, "held") and "monitor/answer_tokens on v1" in held["reason"]
    assert ("answer_tokens", 1) in {(a["name"], a["version"]) for a in held["evidence"]["alerts"]}

    # canary: v1 floods tool calls in half its sessions; half the sessions (sticky) reach it, and its own
    # timeout_rate alert rolls it back before the live reward (which never sees an ungraded flood) could promote it.
    floods = [Phase(None), Phase(1, flood=0.5)]
    canaried = await simulate(
        "canary",
        5,
        proxy.url,
        sm,
        "default",
        SESSIONS,
        phases=floods,
        alias="canaried",
        batch=SESSIONS,
        stub=True,
        policy="canary",
        max_sessions=4 * SESSIONS,
    )
    (decision,) = canaried.decisions
    assert (decision.version, decision.decision) == (1, "rolled_back"), canaried.opened
    assert "timeout_rate@v1" in decision.alerts and 0 < decision.served < decision.after
    serving = {a["name"]: a["deployed_version"] for a in httpx.get(f"{proxy.url}/v1/admin/aliases").json()["data"]}
    assert (serving["gated"], serving["canaried"]) == (1, None)


async def test_on_the_real_engine_a_flood_is_recorded_timed_out_and_drift_is_measured(
    start_proxy: ProxyFactory, tiny_engine: Engine, maker: tuple[str, async_sessionmaker[AsyncSession]]
) -> None:
    url, sm = maker
    await prepare(sm, "default", tiny_engine.model.name, "/unused")  # the alias serves the base model here
    proxy = start_proxy(tiny_engine.url, url)
    async with httpx.AsyncClient(timeout=300) as client:
        harness = Harness(proxy.url, "agent", client, {})
        await harness.session("flooded", Phase(None, flood=1.0), random.Random(0))
        await harness.session("plain", Phase(None), random.Random(0))
    proxy.wait_drained()
    async with sm() as db:
        stats = {
            s.session_id: s
            for s in await load_window(db, "default", "agent", None, parse_config({"settle_s": 0}), DEFAULT_RULE)
        }
        # Drift of the base model's own traffic from the base model: 0 up to what min_tokens does to μ
        # (it renormalises without end-of-turn). The estimator's bias, measured.
        drift = await DriftProbe(tiny_engine.url, sample=4).estimates(db, "default", "agent")
    flooded, plain = stats["flooded"], stats["plain"]
    assert (flooded.timed_out, flooded.graded, flooded.tool_calls) == (True, False, 8)  # cut at the deadline
    assert (plain.timed_out, plain.graded) == (False, True) and plain.tool_calls < 8
    assert set(drift) == {None} and abs(drift[None].value) < 0.05 and drift[None].n == 4, drift
