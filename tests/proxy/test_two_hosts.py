"""Two proxy hosts on one database: an unnamed conversation stays one session whichever host takes a turn.

Two real ``onthejob serve`` processes, each with its own spool root and host id, share only the
database. Turns alternate between them and each is sent as soon as the previous reply ended (an
agent harness behind a load balancer), so every turn reaches the host that did not answer its parent:
the parent is in neither its memory nor its spools, and reaches the database only when the other
host's recorder drains it. Before the linker waited for it, every such turn started a new session.
The stub engine is used for its instant replies: this is about the proxy's linking, not the model
(bench/two_hosts.py measures the same at 500 conversations).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from storage.db import sync_engine
from tests.proxy.conftest import ProxyFactory

CONVERSATIONS, TURNS = 6, 4
FEW_SHOT = [  # an assistant turn no recorded call returned: waited for, then a new session all the same
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
]


async def converse(bases: list[str], n: int, opening: list[dict[str, Any]]) -> list[str]:
    """One conversation, turn t on host (n + t) % 2; the completion ids, turn by turn."""
    messages = [*opening, {"role": "user", "content": f"conversation {n} turn 0"}]
    ids = []
    async with httpx.AsyncClient(timeout=60) as client:
        for turn in range(TURNS):
            r = await client.post(
                f"{bases[(n + turn) % 2]}/v1/chat/completions",
                json={"model": "stub-model", "messages": messages, "max_tokens": 4},
            )
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-request-id"])
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"turn {turn + 1}"}]
    return ids


def landed(db_url: str, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """id -> (session, parent) once every call is in the database (each host drains its own spool)."""
    eng = sync_engine(db_url)
    try:
        deadline = time.monotonic() + 60
        while True:
            with eng.connect() as conn:
                rows = conn.execute(
                    text("SELECT id, session_id, parent_id FROM completions WHERE id = ANY(:ids)"), {"ids": ids}
                ).all()
            if len(rows) >= len(ids) or time.monotonic() > deadline:
                return {r.id: (r.session_id, r.parent_id) for r in rows}
            time.sleep(0.1)
    finally:
        eng.dispose()


def test_turns_alternating_between_two_hosts_stay_one_session_with_each_turn_as_parent(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any, tmp_path: Path
) -> None:
    db_url = pg_factory()
    a = start_proxy(stub_upstream, db_url, spool=tmp_path / "spool-a", env={"ONTHEJOB_HOST_ID": "a"})
    b = start_proxy(stub_upstream, db_url, spool=tmp_path / "spool-b", env={"ONTHEJOB_HOST_ID": "b"})
    for host in (a, b):  # each knows of the other (presence renewed about every second) before the first turn
        deadline = time.monotonic() + 30
        while httpx.get(f"{host.url}/readyz", timeout=5).json().get("hosts") != 2:
            assert time.monotonic() < deadline, "the hosts never saw each other"
            time.sleep(0.2)

    async def main() -> list[list[str]]:
        openings = [FEW_SHOT if n == 0 else [] for n in range(CONVERSATIONS)]
        return await asyncio.gather(*(converse([a.url, b.url], n, openings[n]) for n in range(CONVERSATIONS)))

    conversations = asyncio.run(main())
    rows = landed(db_url, [i for ids in conversations for i in ids])
    assert len(rows) == CONVERSATIONS * TURNS
    split = {n: {rows[i][0] for i in ids} for n, ids in enumerate(conversations) if len({rows[i][0] for i in ids}) > 1}
    assert split == {}, f"conversations split over several sessions: {split}"
    parents = [[rows[i][1] for i in ids] for ids in conversations]
    assert parents == [[None, *ids[:-1]] for ids in conversations]  # each turn continues the one before it
    sessions = {rows[ids[0]][0] for ids in conversations}
    assert len(sessions) == CONVERSATIONS  # and the one with a foreign assistant turn still got its own
    # Turns found their parents through the other host's link entries (proxy/link_feed.py), written as
    # each reply ended, rather than only once that host's recorder had moved the parent into completions.
    found = {name: lookups(host.url) for name, host in (("a", a), ("b", b))}
    assert all(f.get("link_entry", 0) > 0 for f in found.values()), found


def lookups(url: str) -> dict[str, float]:
    """``onthejob_link_lookups_total`` by ``found_in``, from the host's ``/metrics``."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("onthejob_link_lookups_total{"):
            label, value = line.split("}")
            out[label.split('"')[1]] = float(value)
    return out
