"""A secret masked in text cannot come back from token ids: nothing stored detokenizes to it.

Unit: which sampled tokens spell a match. End to end: real SmolLM2 behind the proxy,
a pattern policy, a secret planted in the prompt and one the model says itself; every
list of ids in every stored row is detokenized with the engine's own tokenizer.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session

from engine.launcher import Engine
from proxy.redact import RedactionPolicy, redact_record
from storage.db import sync_engine
from tests.proxy.conftest import ProxyFactory

PLANTED = "sk-PLANTED0123456789"
PATTERNS = [r"sk-[A-Za-z0-9]+", r"Paris"]


def test_tokens_overlapping_a_match_are_the_ones_masked() -> None:
    from proxy.redact_tokens import matched_tokens

    pieces = [b"The", b" key", b" sk", b"-PL", b"ANT", b"ED9", b" is", b" \xe2\x82", b"\xac5"]
    assert matched_tokens(pieces, [re.compile(r"sk-[A-Z0-9]+")]) == [2, 3, 4, 5]
    assert matched_tokens(pieces, [re.compile("€5")]) == [7, 8]  # a character split over two tokens
    assert matched_tokens(pieces, [re.compile("absent")]) == []


def test_a_record_keeps_no_id_of_a_match_and_no_pieces() -> None:
    from proxy.redact_tokens import REDACTED_ID

    chat = [
        {"token": t, "bytes": list(t.encode()), "logprob": -0.1, "top_logprobs": []}
        for t in ("It", " is", " Paris", ".")
    ]  # noqa: E501
    record = {
        "request": {"messages": [{"role": "user", "content": f"key {PLANTED}"}]},
        "prompt_token_ids": [7, 8, 9],
        "response": {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "It is Paris."}, "logprobs": {"content": chat}}
            ]
        },
        "choices": [
            {
                "index": 0,
                "token_ids": [1, 2, 3, 4],
                "logprobs": [-0.1] * 4,
                "pieces": chat,
                "message": {"role": "assistant", "content": "It is Paris."},
            },
            {
                "index": 1,
                "token_ids": [5, 6],
                "logprobs": [-0.1] * 2,
                "pieces": None,
                "message": {"role": "assistant", "content": "Paris!"},
            },
        ],
    }
    sent = repr(record["response"])
    out = redact_record(record, RedactionPolicy(patterns=tuple(re.compile(p) for p in PATTERNS)))
    assert out["choices"][0]["token_ids"] == [1, 2, REDACTED_ID, 4] and out["choices"][0]["redacted"] == 1
    assert out["choices"][1]["token_ids"] == [REDACTED_ID] * 2  # no pieces: nothing of a matching choice is kept
    assert out["prompt_token_ids"] is None and all(c["redacted_prompt"] for c in out["choices"])
    assert "Paris" not in repr(out) and PLANTED not in repr(out) and "pieces" not in repr(out)
    assert repr(record["response"]) == sent  # the client's reply is not touched
    plain = {"choices": [{"index": 0, "token_ids": [1], "pieces": chat[:1]}]}
    assert "pieces" not in redact_record(plain, RedactionPolicy())["choices"][0]


def _int_lists(value: Any) -> list[list[int]]:
    """Every list of integers anywhere in a stored value (ids, wherever they sit)."""
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    if isinstance(value, dict):
        return [lst for v in value.values() for lst in _int_lists(v)]
    if isinstance(value, list):
        return [lst for v in value for lst in _int_lists(v)]
    return []


@pytest.mark.engine
@pytest.mark.default_model
def test_nothing_stored_detokenizes_to_a_planted_secret(
    start_proxy: ProxyFactory, default_engine: Engine, pg_factory: Any
) -> None:
    from transformers import AutoTokenizer

    db_url = pg_factory()
    proxy = start_proxy(default_engine.url, db_url)
    put = httpx.put(f"{proxy.v1}/admin/project", json={"redact": {"patterns": PATTERNS}}, timeout=10)
    assert put.status_code == 200, put.text
    client = openai.OpenAI(base_url=proxy.v1, api_key="unused", max_retries=0)
    model = default_engine.model.name
    ask = [
        {"role": "system", "content": f"Internal note: API key {PLANTED}"},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ]
    said = []
    reply = client.chat.completions.create(model=model, messages=ask, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    said.append(reply.choices[0].message.content or "")
    stream = client.chat.completions.create(model=model, messages=ask, max_tokens=8, temperature=0, stream=True)  # type: ignore[arg-type]
    said.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    text = client.completions.create(
        model=model, prompt="The capital of France is the city of", max_tokens=4, temperature=0
    )
    said.append(text.choices[0].text)
    assert all("Paris" in s for s in said), said  # the model says it: the test means something
    proxy.wait_drained()

    tokenizer = AutoTokenizer.from_pretrained(str(default_engine.model.path))
    eng = sync_engine(db_url)
    meta = MetaData()
    meta.reflect(eng)
    stored: list[str] = []
    id_lists: list[list[int]] = []
    with Session(eng) as db:
        for table in meta.sorted_tables:
            if table.name == "projects":
                continue  # the policy itself names "Paris"
            for row in db.execute(select(table)).mappings():
                stored.append(repr(dict(row)))
                for ids in _int_lists(dict(row)):
                    id_lists.append(ids)
                    stored.append(tokenizer.decode([i for i in ids if 0 <= i < len(tokenizer)]))
    eng.dispose()
    leaks = [item for item in stored if any(s in item for s in (PLANTED, "sk-PL", "Paris"))]
    assert leaks == []
    assert any(-1 in ids for ids in id_lists)  # sampled ids were masked (REDACTED_ID), not dropped

    sessions = httpx.get(f"{proxy.v1}/chat/completions", timeout=10).json()["data"]
    trajectories = httpx.get(
        f"{proxy.v1}/sessions/{sessions[0]['onthejob']['session_id']}/trajectories", timeout=10
    ).json()["data"]
    assert trajectories and all("redacted" in t["flags"] for t in trajectories)
