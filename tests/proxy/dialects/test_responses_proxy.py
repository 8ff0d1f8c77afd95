"""The Responses route's own plumbing, against the stub engine (instant, and faulty on request).

Continuations by ``previous_response_id`` and ``GET /v1/responses/{id}`` must work the
moment the previous reply ended, whichever worker of the host served it (here two
proxies share a spool root and alternate, as ``serve --workers 2`` would); a stream the
engine breaks ends in ``response.failed`` and a partial, token-exact record.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.proxy.conftest import Proxy, ProxyFactory

CONVERSATIONS, TURNS = 4, 3


async def converse(proxies: list[Proxy], n: int) -> list[tuple[str, str, str | None]]:
    """Turns alternate between the proxies; each continues the last by id at once. (id, session, parent)."""
    seen: list[tuple[str, str, str | None]] = []
    previous: str | None = None
    async with httpx.AsyncClient(timeout=30) as client:
        for turn in range(TURNS):
            proxy = proxies[(n + turn) % 2]
            body: dict[str, Any] = {
                "model": "stub-model",
                "input": f"conversation {n} turn {turn}",
                "max_output_tokens": 3,
            }
            if previous:
                body["previous_response_id"] = previous
                got = await client.get(f"{proxy.v1}/responses/{previous}")  # readable there too, at once
                assert got.status_code == 200 and got.json()["id"] == previous, got.text
            r = await client.post(f"{proxy.v1}/responses", json=body)
            assert r.status_code == 200, r.text
            seen.append((r.json()["id"], r.headers["x-session-id"], previous))
            previous = r.json()["id"]
    return seen


def test_continuing_on_another_worker_at_once(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any, tmp_path: Path
) -> None:
    db_url = pg_factory()
    proxies = [start_proxy(stub_upstream, db_url, spool=tmp_path / "spool") for _ in range(2)]

    async def main() -> list[list[tuple[str, str, str | None]]]:
        return await asyncio.gather(*(converse(proxies, n) for n in range(CONVERSATIONS)))

    conversations = asyncio.run(main())
    hello = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    chat = httpx.post(f"{proxies[0].v1}/chat/completions", json=hello, timeout=30)
    for turns in conversations:
        assert len({session for _, session, _ in turns}) == 1, turns  # one session, whichever worker served
    for proxy in proxies:
        proxy.wait_drained()
    stored = httpx.get(f"{proxies[0].v1}/chat/completions", params={"dialect": "responses", "limit": "500"}).json()
    parents = {r["id"]: r["onthejob"]["parent_id"] for r in stored["data"]}
    assert parents == {cid: previous for turns in conversations for cid, _, previous in turns}
    natives = httpx.get(f"{proxies[0].v1}/chat/completions", params={"dialect": "chat"}).json()["data"]
    assert [r["id"] for r in natives] == [chat.headers["x-request-id"]]
    assert natives[0]["onthejob"]["dialect"] == "chat" and "client_request" not in natives[0]["onthejob"]


@pytest.fixture
def proxy(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> Proxy:
    return start_proxy(stub_upstream, pg_factory(), env={"ONTHEJOB_IDLE_TIMEOUT": "5"})


def test_a_broken_stream_ends_in_response_failed_and_a_partial_record(proxy: Proxy) -> None:
    fault, termination = "reset_midstream", "upstream_error"  # a stall takes the same path (test_faults.py)
    body = {
        "model": "stub-model",
        "input": f"stub_fault={fault} stub_gap_ms=30",
        "max_output_tokens": 8,
        "stream": True,
    }
    with httpx.stream("POST", f"{proxy.v1}/responses", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        cid = resp.headers["x-request-id"]
        events = [orjson.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    proxy.wait_drained()
    deadline = time.monotonic() + 10
    while (got := httpx.get(f"{proxy.v1}/chat/completions/{cid}", timeout=10)).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    record = got.json()["onthejob"]
    assert record["termination"] == termination and record["dialect"] == "responses"
    assert 0 < len(record["completion_token_ids"][0]) < 8  # the part that arrived, token-exact
    assert record["client_response"]["status"] == "failed"
