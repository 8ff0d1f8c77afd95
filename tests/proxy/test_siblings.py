"""The sibling read budgets are each sibling's (proxy/spool_siblings.py), as its docstring says."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from proxy.spool import Spool
from proxy.spool_folders import claim
from tests.proxy.records import record

BUDGET = 64 * 1024  # of records
LINK_BUDGET = 4 * 1024  # of link index lines: ~130 B each, ~30 calls


def test_one_siblings_backlog_does_not_hide_another_siblings_parent(tmp_path: Path) -> None:
    """Two siblings, each with a backlog deeper than the budget and, newest, the parent a follow-up asks for.

    Whichever sibling the folder listing gives first, a budget shared by all siblings was spent on it,
    and the other one's parent (during a database outage: nowhere else) was not found.
    """
    (mine_folder, mine_lock), *others = [claim(tmp_path) for _ in range(3)]
    mine = Spool(mine_folder, 10**9)
    siblings = [Spool(folder, 10**9) for folder, _ in others]

    async def write() -> None:
        for n, spool in enumerate(siblings):
            for i in range(200):  # ~1 KiB a record: ~200 KiB of backlog, three times the budget; ~26 KiB indexed
                await spool.append(record(i, id=f"backlog-{n}-{i}", link_key=f"busy-{n}-{i}"))
            await spool.append(record(1000 + n, id=f"parent-{n}", link_key=f"parent-key-{n}"))

    asyncio.run(write())
    assert all(spool.bytes > 2 * BUDGET for spool in siblings)

    for n in range(2):
        found = [e.id for e in mine.sibling_links([f"parent-key-{n}"], budget=LINK_BUDGET)]
        assert found == [f"parent-{n}"], n
        held = [r.id for r in mine.sibling_matching([f'"id":"parent-{n}"'.encode()], budget=BUDGET)]
        assert held == [f"parent-{n}"], n
    # Still a budget: the oldest backlog of each sibling lies beyond it.
    assert list(mine.sibling_links(["busy-0-0", "busy-1-0"], budget=LINK_BUDGET)) == []
    assert list(mine.sibling_matching([b'"id":"backlog-0-0"', b'"id":"backlog-1-0"'], budget=BUDGET)) == []
    for spool in (mine, *siblings):
        spool.close()
    for fd in (mine_lock, *(lock for _, lock in others)):
        os.close(fd)
