"""Three tries of bench/attest_noise.py on the real tiny-model engine (the CI share of issue 33's check):
every version's fingerprint recorded as the proxy records it, then each model probed while calls are in
flight. No false alert; the previous version, the base model and another alias's adapter served under a
version's name are all caught (the tiny model's versions differ far beyond its noise)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from bench.attest_noise import bench, stepped_versions
from engine.launcher import Engine
from engine.weights import ModelInfo
from tests.adapters import light_adapter

pytestmark = pytest.mark.engine
TRIES = 3


def test_three_tries_under_load_no_false_alert_every_swap_caught(
    tiny_engine: Engine, tiny_model: ModelInfo, tmp_path: Path
) -> None:
    paths = stepped_versions(tiny_model, tmp_path / "adapters", 2, 0.02, 0.005, seed=1)
    other = light_adapter(tiny_model, tmp_path / "adapters" / "other", seed=101, scale=0.02)
    names = ["attestci@v1", "attestci@v2"]
    loaded = [*zip(names, paths, strict=True), ("attestciother@v1", other)]
    for name, path in loaded:
        httpx.post(
            f"{tiny_engine.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=300
        ).raise_for_status()
    try:
        result = asyncio.run(bench(tiny_engine.url, tiny_model, names, "attestciother@v1", TRIES, 8))
    finally:
        for name, _ in loaded:
            httpx.post(f"{tiny_engine.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    counts = {name: {k: v for k, v in c.items() if k != "dist"} for name, c in result["counts"].items()}
    assert result["load_calls"] > 0
    assert counts == {
        "attestci@v1": {"false": 0, "prev": 0, "base": TRIES, "other": TRIES},  # v1 has no previous version
        "attestci@v2": {"false": 0, "prev": TRIES, "base": TRIES, "other": TRIES},
    }
    assert {fp["verdict"] for fp in result["fingerprints"].values()} == {"ok"}
