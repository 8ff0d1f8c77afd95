"""Two real engines behind one proxy (proxy/replicas.py, proxy/routing.py, proxy/engine_adapters.py).

A session's turns stay on one engine and new sessions spread, as the engines' own
request counters show; a hung engine leaves rotation, a deployment made meanwhile
reaches the other one and says so, and the hung one gets the version before any
call for it; a version no alias routes to any more is unloaded; an engine killed
mid-run fails only the streams it was serving, a call refused by it is served by
the other, and nothing is recorded twice. The tiny model; the second engine is the run's
``second_tiny_engine`` (the first is the session's ``tiny_engine``), killed here.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from engine.launcher import Engine
from engine.weights import ModelInfo
from storage.db import sync_engine
from storage.models import Completion
from tests.adapters import random_adapter
from tests.proxy.conftest import Proxy, ProxyFactory, add_adapter, metric_sample

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def second_engine(second_tiny_engine: Callable[[], Engine]) -> Iterator[Engine]:
    eng = second_tiny_engine()
    yield eng
    _signal(eng, signal.SIGCONT)  # in case a test stopped it and failed before it went on


def _signal(engine: Engine, sig: signal.Signals) -> None:
    assert engine.proc is not None
    try:
        os.killpg(engine.proc.pid, sig)  # the API server and its engine-core process
    except ProcessLookupError:
        pass


def _served(engine: Engine) -> float:
    """Requests this engine finished, from its own /metrics."""
    text = httpx.get(f"{engine.url}/metrics", timeout=10).text
    return sum(
        float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("vllm:request_success_total{")
    )


def _lists(engine: Engine) -> set[str]:
    return {m["id"] for m in httpx.get(f"{engine.url}/v1/models", timeout=10).json()["data"]}


def _chat(proxy: Proxy, model: str, session: str, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{proxy.v1}/chat/completions",
        headers={"x-session-id": session},
        timeout=120,
        json={
            "model": model,
            "messages": [{"role": "user", "content": f"Hello from {session}"}],
            "max_tokens": 4,
            **extra,
        },
    )


def _which(proxy: Proxy, engines: list[Engine], model: str, session: str) -> int:
    """Send one call; the index of the engine whose counter moved (exactly one must)."""
    before = [_served(e) for e in engines]
    resp = _chat(proxy, model, session)
    assert resp.status_code == 200, resp.text
    moved = [i for i, (e, b) in enumerate(zip(engines, before, strict=True)) if _served(e) != b]
    assert len(moved) == 1, moved
    return moved[0]


def _replica(proxy: Proxy, engine: Engine) -> dict[str, Any]:
    replicas: dict[str, Any] = httpx.get(f"{proxy.url}/readyz", timeout=10).json()["replicas"]
    return replicas[engine.url]  # type: ignore[no-any-return]


def _until(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.2)


def _adapter(db_url: str, model: ModelInfo, folder: Path, version: int) -> None:
    add_adapter(db_url, "default", model.name, version, folder, model.name)


def test_affinity_a_deployment_while_one_engine_hangs_and_unloading(
    start_proxy: ProxyFactory, tiny_engine: Engine, second_engine: Engine, pg_factory: Any, tmp_path: Path
) -> None:
    engines, model = [tiny_engine, second_engine], tiny_engine.model
    db_url = pg_factory()
    proxy = start_proxy(f"{tiny_engine.url},{second_engine.url}", db_url, env={"ONTHEJOB_PROBE_EVERY": "1"})

    # Affinity: each session's turns on one engine, the sessions over both.
    served_by: dict[str, set[int]] = {}
    for _ in range(2):
        for s in ("a", "b", "c", "d"):
            served_by.setdefault(s, set()).add(_which(proxy, engines, model.name, f"aff-{s}"))
    assert all(len(where) == 1 for where in served_by.values()), served_by
    assert set.union(*served_by.values()) == {0, 1}, served_by

    # The second engine hangs: the probe takes it out of rotation; a deployment goes to the first only.
    first = random_adapter(model, tmp_path / "v1")
    _adapter(db_url, model, first, 1)
    _signal(second_engine, signal.SIGSTOP)
    try:
        _until("the hung engine leaves rotation", lambda: _replica(proxy, second_engine)["state"] == "down")
        resp = httpx.post(f"{proxy.v1}/admin/deployments", json={"alias": model.name, "version": 1}, timeout=120)
        assert resp.status_code == 201, resp.text
        assert resp.json()["replicas"] == {tiny_engine.url: "loaded", second_engine.url: "pending"}
        assert _replica(proxy, second_engine)["missing"] == [f"{model.name}@v1"]
        for i in range(3):
            assert _which(proxy, engines[:1], model.name, f"while-down-{i}") == 0
    finally:
        _signal(second_engine, signal.SIGCONT)

    # It answers again: it gets @v1 before any call for it, then serves its share of them.
    start = _served(second_engine)
    calls = 0

    def second_served_the_alias() -> bool:
        nonlocal calls
        calls += 1
        resp = _chat(proxy, model.name, f"after-{calls}")
        assert resp.status_code == 200, resp.text
        return _served(second_engine) > start

    _until("the returning engine serves @v1 calls", second_served_the_alias)
    assert f"{model.name}@v1" in _lists(second_engine)
    metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert not metric_sample(metrics, "onthejob_upstream_retries_total", reason="adapter_missing")
    assert metric_sample(metrics, "onthejob_upstream_up", upstream=second_engine.url) == 1

    # @v2 replaces @v1 everywhere; no alias routes to @v1 any more, so both engines unload it.
    second = shutil.copytree(first, tmp_path / "v2")
    _adapter(db_url, model, second, 2)
    resp = httpx.post(f"{proxy.v1}/admin/deployments", json={"alias": model.name, "version": 2}, timeout=120)
    assert resp.status_code == 201, resp.text
    assert set(resp.json()["replicas"].values()) == {"loaded"}
    _until("@v1 is unloaded from both engines", lambda: all(f"{model.name}@v1" not in _lists(e) for e in engines))
    assert all(f"{model.name}@v2" in _lists(e) for e in engines)
    metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert metric_sample(metrics, "onthejob_adapter_unloads_total", result="ok") == 2


def _stream(
    proxy: Proxy,
    model: str,
    session: str,
    started: threading.Event,
    out: dict[str, Any],
    tokens: int,
    at_first: Callable[[], None] | None = None,
) -> None:
    """A stream of ``tokens``: records its id, whether it ended with [DONE] and no error event;
    ``at_first`` runs when its first event arrives (before ``started`` is set)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Hello from {session}"}],
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    with httpx.stream(
        "POST", f"{proxy.v1}/chat/completions", headers={"x-session-id": session}, json=body, timeout=120
    ) as resp:
        out["id"] = resp.headers["x-request-id"]
        lines = []
        for line in resp.iter_lines():
            if line.startswith("data:"):
                lines.append(line)
                if not started.is_set() and at_first is not None:
                    at_first()
                started.set()
    out["ok"] = lines[-1:] == ["data: [DONE]"] and not any('"error"' in line for line in lines)


def test_an_engine_killed_mid_run(
    start_proxy: ProxyFactory, tiny_engine: Engine, second_engine: Engine, pg_factory: Any
) -> None:
    engines, model = [tiny_engine, second_engine], tiny_engine.model.name
    db_url = pg_factory()
    # A probe every minute: the killed engine is found by the calls it refuses, not by a probe.
    proxy = start_proxy(f"{tiny_engine.url},{second_engine.url}", db_url, env={"ONTHEJOB_PROBE_EVERY": "60"})
    home = {s: _which(proxy, engines, model, s) for s in ("k1", "k2", "k3", "k4")}
    on_second = [s for s, i in home.items() if i == 1]
    assert on_second and len(on_second) < 4, home
    streams = {s: ({}, threading.Event()) for s in home}
    # One long stream on the engine to be killed, which that stream's own thread freezes (SIGSTOP) the
    # moment its first event arrives: it cannot finish before the kill however fast the machine is
    # (freezing it from here, after waiting for all of its streams to start, once let both finish).
    # Its other sessions' streams may start before the freeze (and break at the kill) or after it (and
    # be sent to the other engine at the kill, having had no answer): either way only they may fail.
    long = on_second[0]
    freeze = functools.partial(_signal, second_engine, signal.SIGSTOP)
    threads = [
        threading.Thread(
            target=_stream,
            args=(proxy, model, s, started, out, 1000 if s == long else 50, freeze if s == long else None),
        )
        for s, (out, started) in streams.items()
    ]
    for t in threads:
        t.start()
    assert streams[long][1].wait(60)
    for s, (_, started) in streams.items():  # the surviving engine's streams run; then the other dies
        if s not in on_second:
            assert started.wait(60)
    _signal(second_engine, signal.SIGKILL)
    assert second_engine.proc is not None
    second_engine.proc.wait(30)

    # The sessions whose engine died continue: refused there, served by the other one.
    after = [_chat(proxy, model, s) for s in on_second]
    assert [r.status_code for r in after] == [200] * len(on_second), [r.text for r in after]
    for t in threads:
        t.join(120)
    failed = {s for s, (out, _) in streams.items() if not out["ok"]}
    assert long in failed and failed <= set(on_second), (failed, home)  # it was streaming; only its streams failed
    metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert (metric_sample(metrics, "onthejob_upstream_retries_total", reason="refused") or 0) >= 1
    assert metric_sample(metrics, "onthejob_upstream_up", upstream=second_engine.url) == 0
    assert _replica(proxy, second_engine)["state"] == "down"

    # One record per call the client made: 4 + 4 streams + the continued turns, none twice.
    proxy.wait_drained()
    ids = [out["id"] for out, _ in streams.values()] + [r.headers["x-request-id"] for r in after]
    eng = sync_engine(db_url)
    with Session(eng) as db:
        assert db.scalar(select(func.count()).select_from(Completion)) == 4 + len(ids)
        rows = {c.id: (c.status_code, c.termination) for c in db.scalars(select(Completion))}
    eng.dispose()
    assert all(rows[i][0] == 200 for i in ids[len(streams) :])
    for s, (out, _) in streams.items():
        assert (rows[out["id"]][1] == "upstream_error") == (s in failed), (s, rows[out["id"]])
