"""Follow-up turns find their session when another worker served the previous turn.

With ``serve --workers N`` (or several proxies sharing one spool folder) each process has
its own link cache and spool, and a turn's record reaches the database only when its
process's recorder drains (every 50 ms). A harness that answers its tool at once sends the
next turn sooner than that, often on another connection and so to another worker. Here two
proxies share a spool root and the turns alternate between them, which is that race made
certain. The stub engine is used for its instant, deterministic replies: this is about the
proxy's session resolution, not the model.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.models import Completion
from tests.proxy.conftest import ProxyFactory

CONVERSATIONS, TURNS = 12, 5


async def converse(bases: list[str], n: int) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"conversation {n} turn 0"}]
    async with httpx.AsyncClient(timeout=30) as client:
        for turn in range(TURNS):
            r = await client.post(
                f"{bases[(n + turn) % 2]}/v1/chat/completions",
                json={"model": "stub-model", "messages": messages, "max_tokens": 4},
            )
            assert r.status_code == 200, r.text
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"turn {turn + 1}"}]


def rows_when_all_landed(db_url: str, expected: int) -> list[Any]:
    """Each proxy drains its own spool: wait until every call is in the database."""
    eng = sync_engine(db_url)
    try:
        deadline = time.monotonic() + 30
        while True:
            with Session(eng) as db:  # ORM rows: a call stored as a delta of its parent arrives in full
                rows = [
                    SimpleNamespace(session_id=c.session_id, req=orjson.dumps(c.request).decode())
                    for c in db.scalars(select(Completion))
                ]
            if len(rows) >= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)
    finally:
        eng.dispose()


def test_turns_served_by_different_workers_share_one_session(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any, tmp_path: Path
) -> None:
    db_url = pg_factory()
    a = start_proxy(stub_upstream, db_url, spool=tmp_path / "spool")
    b = start_proxy(stub_upstream, db_url, spool=tmp_path / "spool")

    async def main() -> None:
        await asyncio.gather(*(converse([a.url, b.url], n) for n in range(CONVERSATIONS)))

    asyncio.run(main())
    rows = rows_when_all_landed(db_url, CONVERSATIONS * TURNS)
    assert len(rows) == CONVERSATIONS * TURNS
    sessions: dict[int, set[str]] = {}
    for row in rows:
        n = int(row.req.split("conversation ")[1].split(" ")[0])
        sessions.setdefault(n, set()).add(row.session_id)
    split = {n: len(s) for n, s in sessions.items() if len(s) > 1}
    assert split == {}, f"conversations split over several sessions: {split}"
