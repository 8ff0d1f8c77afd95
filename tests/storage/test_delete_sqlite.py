"""Deletion on SQLite (``onthejob`` on one machine): the same entries, times and checks as on Postgres.

A delete writes its deletion entries (xid 0: SQLite's writers are serial) and tombstones with a time;
the recorder's portable check drops a call made before it and keeps one made after; the trainer's
last look keeps the items of a session started afresh and drops the deleted ones.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session

from storage import deletion
from storage.changes import START, deleted_after, deletions_since, latest_deletion
from storage.db import async_engine, sync_engine
from storage.migrate import upgrade
from storage.models import Completion, Tombstone
from tests.proxy.records import record
from tests.storage.rows import choice, new_project, row


def test_a_delete_on_sqlite_is_logged_timed_and_checked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade(url)
    engine = sync_engine(url)
    try:
        with Session(engine) as db:
            project = new_project(db)
            db.add(Completion(**row(f"{project}-1", [1], [choice([5, 2])], project=project, session="s1")))
            db.commit()
            deletion.delete_end_user(db, project, "nobody")  # an end user with no calls: their entry alone
            deletion.delete_session(db, project, "s1")
            db.commit()
            entries = deletions_since(db, START)
            assert [(d.session_id, d.end_user, d.position.xid) for d in entries] == [
                (None, "nobody", 0),
                ("s1", None, 0),
            ]
            assert latest_deletion(db) == entries[-1].position
            assert deleted_after(db, project, ["s1", "s2"], START) == {"s1"}
            at = db.get_one(Tombstone, (project, "s1")).created_at

            # A call of "s1" made after the delete: the trainer keeps what was read from it.
            db.add(Completion(**row(f"{project}-2", [1], [choice([5, 2])], project=project, session="s1")))
            db.commit()
            kept, dropped = deletion.live(
                db, project, [[f"{project}-1"], [f"{project}-2"]], lambda _: "s1", lambda calls: calls
            )
            assert (kept, dropped) == ([[f"{project}-2"]], 1)
            deletion.delete_session(db, project, "s1")  # deleted again: the tombstone's time moves on
            db.commit()
            db.expire_all()
            again = db.get_one(Tombstone, (project, "s1")).created_at
            assert again > at
            at = again
            assert deletion.live(db, project, [[f"{project}-2"]], lambda _: "s1", lambda calls: calls)[1] == 1

        stamp = at.replace(tzinfo=UTC)  # SQLite hands times back naive
        calls = [
            record(0, session="s1", project_id=project, created_at=(stamp - timedelta(seconds=1)).isoformat()),
            record(1, session="s1", project_id=project, created_at=(stamp + timedelta(seconds=1)).isoformat()),
        ]

        async def check() -> deletion.Deleted:
            aengine = async_engine(url)
            try:
                async with async_sessionmaker(aengine)() as adb:
                    return await deletion.tombstoned_async(adb, calls)
            finally:
                await aengine.dispose()

        gone = asyncio.run(check())
        assert [gone.drops(c) for c in calls] == [True, False]
    finally:
        engine.dispose()
