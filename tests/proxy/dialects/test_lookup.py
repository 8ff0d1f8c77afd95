"""Finding a dialect call by id: this worker's memory, a sibling worker's spool, then the database."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker

from proxy.dialects.lookup import RecentCalls, find, id_needle
from proxy.spool import Spool
from storage.db import async_engine
from tests.proxy.records import record

pytestmark = pytest.mark.anyio


async def test_memory_then_sibling_spool_then_database(tmp_path: Path, pg_url: str) -> None:
    mine, sibling = Spool(tmp_path / "w-mine", 10**9), Spool(tmp_path / "w-sibling", 10**9)
    recent = RecentCalls(size=2)
    here = record(1, id="resp_here", project_id="p")
    there = record(1, id="resp_there", project_id="p")
    # Its child names it as parent: the id needle must not take "parent_id" for "id".
    child = record(3, id="resp_child", project_id="p", parent_id="resp_there2")
    await sibling.append(there)
    await sibling.append(child)
    evicted = record(1, id="resp_evicted", project_id="p")  # spooled here, no longer in this worker's memory
    await mine.append(evicted)
    recent.put(here.project_id, here.id, here.encode())
    engine = async_engine(pg_url)
    maker = async_sessionmaker(engine, expire_on_commit=False)

    async def lookup(project: str, call_id: str) -> Any:
        spools = partial(mine.sibling_matching, own=True)
        return await find(project, call_id, recent=recent, spools=spools, sessionmaker=maker)

    try:
        found = await lookup("p", "resp_here")
        assert found is not None and found.client_request == {"input": "héllo 1"}
        found = await lookup("p", "resp_there")
        assert found is not None and found.id == "resp_there" and found.dialect == "responses"
        assert found.request["messages"][0]["role"] == "user"
        found = await lookup("p", "resp_evicted")
        assert found is not None and found.id == "resp_evicted"
        assert await lookup("other", "resp_there") is None  # another project's looks unknown
        assert await lookup("other", "resp_here") is None
        assert await lookup("p", "resp_there2") is None  # only named as a parent
        assert await lookup("p", "resp_nowhere") is None  # the database has none either
    finally:
        mine.close()
        sibling.close()
        await engine.dispose()


def test_recent_calls_are_bounded_in_calls_and_in_bytes() -> None:
    recent = RecentCalls(size=2)
    for i in range(3):
        kept = record(i, id=f"resp_{i}")
        recent.put(kept.project_id, kept.id, kept.encode())
    assert recent.get("p", "resp_0") is None and recent.get("p", "resp_2") is not None
    lines = [record(i, id=f"resp_{i}").encode() for i in range(4)]
    recent = RecentCalls(size=100, max_bytes=sum(map(len, lines[1:])))
    for i, line in enumerate(lines):
        recent.put("p", f"resp_{i}", line)
    assert [recent.get("p", f"resp_{i}") is not None for i in range(4)] == [False, True, True, True]
    assert recent.bytes == sum(map(len, lines[1:]))
    recent.put("p", "resp_3", lines[3])  # kept again: counted once
    assert recent.bytes == sum(map(len, lines[1:]))


@pytest.fixture
def pg_url(pg_factory: Any) -> str:
    return pg_factory()  # type: ignore[no-any-return]


async def test_a_deep_backlog_here_never_hides_a_siblings_record(tmp_path: Path) -> None:
    mine, sibling = Spool(tmp_path / "w-mine", 10**9), Spool(tmp_path / "w-sibling", 10**9)
    try:
        there = record(1, id="resp_there")
        await sibling.append(there)
        for i in range(20):  # this worker's own spool: more than the budget by itself
            await mine.append(record(i, id=f"resp_mine_{i}"))
        budget = 3 * len(there.encode())
        found = [r.id for r in mine.sibling_matching([id_needle("resp_there")], budget, own=True)]
        assert found == ["resp_there"]
        found = [r.id for r in mine.sibling_matching([id_needle("resp_mine_19")], budget, own=True)]
        assert found == ["resp_mine_19"]  # the newest of this worker's, within its own budget
        assert list(mine.sibling_matching([id_needle("resp_mine_19")], budget)) == []  # siblings only
    finally:
        mine.close()
        sibling.close()
