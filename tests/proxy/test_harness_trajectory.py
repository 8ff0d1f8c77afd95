"""A tool-using harness (openai SDK, its own loop and tool) → proxy → real SmolLM2 → one trajectory.

The masked tokens must be exactly what vLLM sampled (ids and logprobs, call by
call), the tool's output must sit in the unmasked part, and a session grade
must become the trajectory's reward.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from engine.launcher import Engine
from tests.proxy.conftest import ProxyFactory

pytestmark = [pytest.mark.engine, pytest.mark.default_model]

SYSTEM = (
    "You can use a calculator. To use it, reply with a line 'CALC: <expression>'. "
    "You will get 'RESULT: <value>'. Then give the final answer as 'ANSWER: <number>'."
)


def calculator(text: str) -> str:
    """The harness's own tool: it runs here, never in the proxy."""
    expr = text.split("CALC:", 1)[1].strip().splitlines()[0] if "CALC:" in text else "17*3"
    allowed = set("0123456789+-*/(). ")
    return str(eval(expr, {"__builtins__": {}})) if expr and set(expr) <= allowed else "error"  # noqa: S307


def test_tool_using_session_becomes_one_token_exact_trajectory(
    start_proxy: ProxyFactory, default_engine: Engine, pg_url: str
) -> None:
    proxy = start_proxy(default_engine.url, pg_url)
    client = openai.OpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 17 times 3?"},
    ]
    sessions, call_ids, tool_outputs = set(), [], []
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=default_engine.model.name, messages=messages, max_tokens=24, temperature=0.7, seed=turn
        )  # type: ignore[arg-type]
        sessions.add(raw.headers["x-session-id"])
        call_ids.append(raw.headers["x-request-id"])
        text = raw.parse().choices[0].message.content or ""
        result = f"RESULT: {calculator(text)}"
        tool_outputs.append(result)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": result}]
    assert len(sessions) == 1, "the conversation must link into one session without any header"
    session = sessions.pop()
    fb = httpx.post(
        f"{proxy.v1}/feedback",
        json={"target": {"session_id": session}, "name": "reward", "value": 0.75, "id": "grade-1"},
        timeout=10,
    )
    assert fb.status_code in (201, 202), fb.text
    proxy.wait_drained()
    got = httpx.get(f"{proxy.v1}/sessions/{session}/trajectories", timeout=30).json()
    trajectories = got["data"] if "data" in got else got["trajectories"]
    assert len(trajectories) == 1
    traj = trajectories[0]
    assert traj["completion_ids"] == call_ids
    sampled, sampled_lp = [], []
    for cid in traj["completion_ids"]:
        rec = httpx.get(f"{proxy.v1}/chat/completions/{cid}", timeout=10).json()["onthejob"]
        sampled += rec["completion_token_ids"][0]
        sampled_lp += rec["logprobs"][0]
    ids, mask, lps = traj["token_ids"], traj["mask"], traj["logprobs"]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == sampled
    assert [lp for lp, m in zip(lps, mask, strict=True) if m] == sampled_lp
    assert all(lp is None for lp, m in zip(lps, mask, strict=True) if not m)
    # The tool's output is in the context (mask 0), token for token as the engine saw it.
    tok = AutoTokenizer.from_pretrained(default_engine.model.path)
    unmasked = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    for output in tool_outputs[: len(traj["completion_ids"]) - 1]:
        assert output in unmasked
    assert traj["reward"] == 0.75
    assert "rerender_mismatch" not in traj["flags"], traj["flags"]
