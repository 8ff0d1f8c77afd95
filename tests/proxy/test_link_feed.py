"""Link entries: a call one host answered is a parent for another host before its row lands (proxy/link_feed.py).

Two :class:`Linker` objects stand for two hosts on one database, each with its own spool and memory; no
recorder runs, so ``completions`` stays empty: only the answering host's link entries can link the turn.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session

from proxy.link_feed import LinkFeed, Listener
from proxy.link_keys import Naming, prefix_keys
from proxy.sessions import Link, Linker
from proxy.spool import Spool
from storage.db import async_engine, libpq_url, sync_engine
from storage.deletion import delete_session
from storage.models import LinkEntry, Project

MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "tell me more"},
]
UNNAMED = Naming(None, None, (), None, "new")


def host(url: str, folder: Path, feed: bool = True) -> tuple[Linker, Any]:
    engine = async_engine(url)
    linker = Linker(Spool(folder, 10**9), async_sessionmaker(engine, expire_on_commit=False), wait_s=0.4)
    linker.other_hosts = lambda: True  # the other host is live (its presence row, in the proxy)
    linker.feed = LinkFeed(linker.sessionmaker, folder.name) if feed else None
    linker.listener = Listener(libpq_url(url), folder.name)
    return linker, engine


def entries(url: str, session: str) -> int:
    with Session(sync_engine(url)) as db:
        return int(db.scalar(select(func.count()).select_from(LinkEntry).where(LinkEntry.session_id == session)) or 0)


@pytest.mark.anyio
@pytest.mark.parametrize("written", [True, False], ids=["feed", "no-feed"])
async def test_a_turn_on_the_other_host_links_to_a_call_whose_row_has_not_landed(
    pg_url: str, tmp_path: Path, written: bool
) -> None:
    project, session = f"p-{uuid.uuid4().hex[:8]}", f"ses_{uuid.uuid4().hex[:8]}"
    with Session(sync_engine(pg_url)) as db:
        db.merge(Project(id=project, settings={}))
        db.commit()
    keys = prefix_keys(MESSAGES)
    (a, ea), (b, eb) = host(pg_url, tmp_path / "a", feed=written), host(pg_url, tmp_path / "b")
    tasks = [asyncio.create_task(x.feed.run()) for x in (a, b) if x.feed is not None]
    tasks += [asyncio.create_task(x.listener.run()) for x in (a, b) if x.listener is not None]
    try:
        while not (a.listener and a.listener.connected and b.listener and b.listener.connected):
            await asyncio.sleep(0.01)
        made = datetime.now(UTC).isoformat()
        a.remember(project, [keys[1]], Link(session, "cmpl-parent", "t1", None, made))  # host a answered turn 0
        found = await b.resolve(project, UNNAMED, MESSAGES, keys)  # turn 1 reaches host b at once
        if not written:  # nothing but the recorder could tell host b, and none runs here: a new session
            assert found.source == "new" and b.lookups == {"none": 1}
            return
        assert (found.id, found.source, found.parent_id, found.task_id) == (session, "linked", "cmpl-parent", "t1")
        assert b.lookups == {"link_entry": 1}
        assert a.feed is not None and (a.feed.written, a.feed.failed, a.feed.dropped) == (1, 0, 0)
        # Host a's write woke host b's listener (NOTIFY); a host's own writes do not wake it.
        await asyncio.sleep(0.1)
        assert (a.listener.notified, b.listener.notified) == (0, 1)

        # Deleting the session takes its entries with it, in the delete's transaction.
        with Session(sync_engine(pg_url)) as db:
            delete_session(db, project, session)
            db.commit()
        assert entries(pg_url, session) == 0
        # An entry written after the delete (host a had not heard of it) is not a parent once host b has.
        b.deletes.forget(project, [session])
        a.remember(project, [keys[1]], Link(session, "cmpl-parent", "t1", None, made))
        await asyncio.sleep(0.1)
        assert entries(pg_url, session) == 1
        again = await b.resolve(project, UNNAMED, [*MESSAGES, {"role": "user", "content": "x"}], [*keys, "k"])
        assert again.source == "new"
    finally:
        for t in tasks:
            t.cancel()
        for linker, engine in ((a, ea), (b, eb)):
            linker.spool.close()
            await engine.dispose()


@pytest.mark.anyio
async def test_the_feed_never_holds_a_call_up_and_counts_what_it_loses(tmp_path: Path) -> None:
    """A database that refuses (here: nothing listens) costs the feed its entries, counted; put never waits."""
    engine = async_engine("postgresql+psycopg://onthejob@127.0.0.1:1/none")
    feed = LinkFeed(async_sessionmaker(engine, expire_on_commit=False), "a", cap=3)
    link = Link("ses_x", "cmpl-x", None)
    for i in range(5):
        feed.put("p", f"k{i}", link)
    assert (len(feed.queue), feed.dropped) == (3, 2)  # the oldest went
    task = asyncio.create_task(feed.run())
    try:
        for _ in range(100):
            if feed.failed:
                break
            await asyncio.sleep(0.05)
        assert (feed.written, feed.failed, len(feed.queue)) == (0, 3, 0)
    finally:
        task.cancel()
        await engine.dispose()
