"""Another worker learns of a delete from the change log: its link cache and its siblings' spools give no parent.

Worker A holds the deleted conversation's link in memory, and a sibling worker's spool still holds
the deleted call (not drained yet). The delete is taken elsewhere (by the database alone, as another
host would); A reads the deletion entry (``Deletes.follow_once``, what its background loop runs) and a
follow-up of that conversation then starts a new session. A call of that id made afterwards links again.
Real Postgres; the end-user variant too.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session

from proxy.link_keys import Naming, link_key, prefix_keys
from proxy.sessions import Link, Linker
from proxy.spool import Spool
from proxy.spool_folders import claim
from storage import deletion
from storage.db import async_engine, sync_engine
from storage.keys import ensure_project
from tests.proxy.records import record

pytestmark = pytest.mark.anyio
FIRST = [{"role": "user", "content": "hello"}]
REPLY = {"role": "assistant", "content": "hi there"}
FOLLOW = [*FIRST, REPLY, {"role": "user", "content": "and then?"}]
UNNAMED = Naming(None, None, (), None, "new")


@pytest.mark.parametrize("by", ["session", "end_user"])
async def test_a_worker_following_the_log_links_nothing_to_a_deleted_session(
    pg_url: str, tmp_path: Path, by: str
) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    with Session(sync_engine(pg_url)) as db:
        ensure_project(db, project)
        db.commit()
    key = link_key(prefix_keys(FIRST)[-1], REPLY)
    assert key is not None
    (mine, _), (other, _) = claim(tmp_path), claim(tmp_path)
    spool, sibling = Spool(mine, 10**9), Spool(other, 10**9)
    engine = async_engine(pg_url)
    linker = Linker(spool, async_sessionmaker(engine, expire_on_commit=False))
    try:
        await linker.deletes.follow_once()  # a worker starts at the newest deletion entry
        # In memory: this worker served the first turn; in a sibling's spool: the same call, not drained yet.
        made = record(0, session="ses_gone", project_id=project, link_key=key, end_user="alice")
        linker.remember(project, [key], Link("ses_gone", made.id, None, "alice", made.created_at))
        await sibling.append(made)
        before = await linker.resolve(project, UNNAMED, FOLLOW, prefix_keys(FOLLOW))
        assert (before.id, before.source) == ("ses_gone", "linked")

        with Session(sync_engine(pg_url)) as db:  # the delete, taken by another worker or host
            if by == "session":
                deletion.delete_session(db, project, "ses_gone")
            else:
                deletion.delete_end_user(db, project, "alice")
            db.commit()
        assert await linker.deletes.follow_once() == 1
        after = await linker.resolve(project, UNNAMED, FOLLOW, prefix_keys(FOLLOW))
        assert (after.source, after.parent_id) == ("new", None) and after.id != "ses_gone"

        # A call of that session made after the delete is a parent as usual.
        later = record(
            1, session="ses_gone", project_id=project, link_key=key, created_at=datetime.now(UTC).isoformat()
        )
        linker.remember(project, [key], Link("ses_gone", later.id, None, None, later.created_at))
        again = await linker.resolve(project, UNNAMED, FOLLOW, prefix_keys(FOLLOW))
        assert (again.id, again.parent_id) == ("ses_gone", later.id)
    finally:
        spool.close()
        sibling.close()
        await engine.dispose()


async def test_a_call_of_a_deleted_session_cannot_be_continued_by_id(pg_url: str, tmp_path: Path) -> None:
    """``previous_response_id`` naming a call made before its session's delete: not found, wherever it is kept."""
    project = f"p-{uuid.uuid4().hex[:8]}"
    (folder, _) = claim(tmp_path)
    spool = Spool(folder, 10**9)
    engine = async_engine(pg_url)
    linker = Linker(spool, async_sessionmaker(engine, expire_on_commit=False))
    try:
        spooled = record(0, session="ses_gone", project_id=project)  # not drained yet
        linker.recent.put(project, spooled.id, await spool.append(spooled))
        drained = record(1, session="ses_gone", project_id=project)  # in memory only: its copy was dropped
        linker.recent.put(project, drained.id, drained.encode())
        assert (await linker.find_call(project, spooled.id)) is not None
        assert (await linker.find_call(project, drained.id)) is not None

        linker.deletes.forget(project, ["ses_gone"])
        assert await linker.find_call(project, spooled.id) is None
        assert await linker.find_call(project, drained.id) is None
        later = record(2, session="ses_gone", project_id=project, created_at=datetime.now(UTC).isoformat())
        linker.recent.put(project, later.id, await spool.append(later))
        found = await linker.find_call(project, later.id)
        assert found is not None and found.id == later.id  # made after the delete: continued as usual
    finally:
        spool.close()
        await engine.dispose()
