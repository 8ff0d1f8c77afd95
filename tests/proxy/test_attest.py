"""Attestation with two real engines (tiny model): a deployed adapter's weights are overwritten on disk and
reloaded into one engine; the fingerprint check catches it, that replica stops serving the version, an alert
is raised, and the other replica serves every call. The second engine is the run's (``second_tiny_engine``)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.launcher import Engine
from proxy.fingerprint import parse_probe, probe_body, same, tolerance_of
from storage.alerts import open_alerts
from storage.db import async_engine
from tests.adapters import random_adapter
from tests.proxy.conftest import ProxyFactory
from tests.proxy.test_promotion import _publish

# Not test_promotion's alias: the session's engine still holds its helper@v1 (vLLM caches adapters by name).
ALIAS = "attested"

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def other_engine(second_tiny_engine: Callable[[], Engine]) -> Iterator[Engine]:
    eng = second_tiny_engine()
    yield eng
    # Shared with test_engine_replicas.py: leave it without the overwritten adapter this module loaded.
    httpx.post(f"{eng.url}/v1/unload_lora_adapter", json={"lora_name": f"{ALIAS}@v1"}, timeout=60)


def test_fingerprints_agree_within_tolerance_only() -> None:
    a = {"tokens": ["x", "y", "z"], "logprobs": [-0.1, -0.2, -0.3]}
    assert same(a, {"tokens": ["x", "y", "z"], "logprobs": [-0.11, -0.2, -0.3]})
    assert same(a, {"tokens": ["x", "q", "r"], "logprobs": [-0.1, -0.2, -5.0]})  # a near-tie flipped later
    assert not same(a, {"tokens": ["x", "y", "z"], "logprobs": [-0.5, -0.2, -0.3]})
    assert not same(a, {"tokens": ["w", "y", "z"], "logprobs": [-0.1, -0.2, -0.3]})  # the first choice differs


def _probe(url: str, model: str) -> dict[str, Any]:
    return parse_probe(httpx.post(f"{url}/v1/completions", json=probe_body(model), timeout=120).json())


def test_overwritten_weights_reloaded_into_one_engine_are_caught(
    start_proxy: ProxyFactory, tiny_engine: Engine, other_engine: Engine, pg_factory: Any, tmp_path: Path
) -> None:
    db_url = pg_factory()
    proxy = start_proxy(
        f"{tiny_engine.url},{other_engine.url}",
        db_url,
        env={"ONTHEJOB_ATTEST_EVERY": "1", "ONTHEJOB_RATE_LIMIT_RPS": "0"},
    )
    httpx.post(
        f"{proxy.v1}/admin/aliases", json={"name": ALIAS, "base_model": tiny_engine.model.name}, timeout=30
    ).raise_for_status()
    _publish(db_url, tiny_engine, tmp_path, 1, seed=1, alias=ALIAS)
    httpx.post(f"{proxy.v1}/admin/deployments", json={"alias": ALIAS, "version": 1}, timeout=120).raise_for_status()
    deadline = time.monotonic() + 120
    while not (rows := httpx.get(f"{proxy.v1}/admin/aliases/{ALIAS}/attestations", timeout=30).json()["data"]):
        assert time.monotonic() < deadline, "v1 was never attested"  # measured in the background after deploy
        time.sleep(0.2)
    [attested] = rows
    assert attested["version"] == 1 and attested["excluded_replicas"] == []
    expected = attested["fingerprint"]
    assert same(expected, _probe(other_engine.url, f"{ALIAS}@v1"))

    # Someone overwrites v1's weights on disk, and one engine reloads it under the same name.
    folder = tmp_path / "v1"
    shutil.copy(
        random_adapter(tiny_engine.model, tmp_path / "other", seed=7) / "adapter_model.safetensors",
        folder / "adapter_model.safetensors",
    )
    name = {"lora_name": f"{ALIAS}@v1"}
    httpx.post(f"{other_engine.url}/v1/unload_lora_adapter", json=name, timeout=60).raise_for_status()
    httpx.post(
        f"{other_engine.url}/v1/load_lora_adapter", json={**name, "lora_path": str(folder)}, timeout=60
    ).raise_for_status()
    assert not same(expected, _probe(other_engine.url, f"{ALIAS}@v1")), "the overwrite changed nothing"

    deadline = time.monotonic() + 120
    while True:  # the periodic check (every second here) finds it
        [row] = httpx.get(f"{proxy.v1}/admin/aliases/{ALIAS}/attestations", timeout=30).json()["data"]
        if row["excluded_replicas"]:
            break
        assert time.monotonic() < deadline, row
        time.sleep(0.5)
    assert row["excluded_replicas"] == [other_engine.url]
    alerts = asyncio.run(_alerts(db_url))
    assert [(a["kind"], a["version"], a["replica"]) for a in alerts] == [("attestation", 1, other_engine.url)]
    # Every call for the alias now goes to the engine that serves the attested weights: call i sends the probe's
    # i-th prompt (the proxy takes one prompt a call) and gets the next tokens the fingerprint holds there.
    probe = probe_body(ALIAS)
    for i in range(6):
        body = {**probe, "prompt": probe["prompt"][i]}
        reply = httpx.post(f"{proxy.v1}/completions", json=body, headers={"x-session-id": f"s{i}"}, timeout=120)
        at_i = {"kind": "forced", "top": [expected["top"][i]]}
        assert same(at_i, parse_probe(reply.json()), tolerance_of(expected)), f"call {i}"


async def _alerts(db_url: str) -> list[dict[str, Any]]:
    from sqlalchemy.ext.asyncio import AsyncSession

    eng = async_engine(db_url)
    async with AsyncSession(eng) as db:
        rows = await open_alerts(db, "default", ALIAS, 1)
        out = [{"kind": a.kind, "version": a.version, "replica": a.detail.get("replica")} for a in rows]
    await eng.dispose()
    return out
