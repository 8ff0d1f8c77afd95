"""Replica faults through the real call path, without engines: a dead replica beside the stub engine.

A call refused by the dead replica is served by the other one (and takes the dead one
out of rotation); 5xx answers are passed on, not retried, and three in a row take
the answering replica out too; with every replica out, calls are still tried.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import free_port
from tests.proxy.conftest import ProxyFactory, metric_sample


def test_a_dead_replica_and_a_failing_one(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy(f"{dead},{stub_upstream}", pg_factory(), env={"ONTHEJOB_PROBE_EVERY": "3600"})

    def call(session: str, **extra: Any) -> int:
        body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}
        return httpx.post(
            f"{proxy.v1}/chat/completions", json=body, headers={"x-session-id": session}, timeout=30
        ).status_code

    def metric(name: str, **labels: str) -> float:
        return metric_sample(httpx.get(f"{proxy.url}/metrics", timeout=10).text, name, **labels) or 0.0

    def state(url: str) -> str:
        return str(httpx.get(f"{proxy.url}/readyz", timeout=10).json()["replicas"][url]["state"])

    assert state(dead) == "down"  # the probe at start got no answer
    assert [call(f"s{i}") for i in range(4)] == [200] * 4  # none was tried on the dead replica
    assert metric("onthejob_upstream_retries_total", reason="refused") == 0

    assert [call(f"f{i}", stub_fault="500") for i in range(3)] == [502] * 3  # passed on, not retried
    assert metric("onthejob_upstream_failures_total", upstream=stub_upstream, kind="http_5xx") == 3
    assert state(stub_upstream) == "down"  # three in a row: out of rotation (and held out for a while)

    # Nothing in rotation: every replica is tried, in turn; where the dead one is tried first, it
    # refuses and the stub answers.
    assert [call("after-1"), call("after-2")] == [200, 200]
    assert metric("onthejob_upstream_retries_total", reason="refused") >= 1
    assert metric("onthejob_upstream_failures_total", upstream=dead, kind="refused") >= 1
    assert metric("onthejob_upstream_up", upstream=dead) == 0
