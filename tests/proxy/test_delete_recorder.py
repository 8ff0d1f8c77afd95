"""At drain time a tombstone drops the calls made before its delete, by the database's clock, and no others.

Both write paths (COPY, portable). The proxy's clock here runs an hour ahead of the database's:
a call it stamped 59 minutes "after" the delete was made before it by the database's clock, and is
dropped; one stamped an hour and a minute after lands. Comparing the stamps with the tombstone as
they are would land both. A copy of a pre-delete call drained after the session started afresh
leaves the fresh session (its row and calls) alone.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from proxy.recorder import Recorder
from storage import bulk, deletion
from storage.db import async_engine
from tests.proxy.records import record
from tests.proxy.test_recorder import drain

pytestmark = pytest.mark.anyio
AHEAD = timedelta(hours=1)


class Ahead(datetime):
    """``datetime`` whose ``now`` is this host's clock an hour fast."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + AHEAD


@pytest.mark.parametrize("portable", [False, True])
async def test_a_tombstone_drops_only_calls_made_before_the_delete_on_the_databases_clock(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, portable: bool
) -> None:
    engine = async_engine(pg_factory())
    monkeypatch.setattr(bulk, "datetime", Ahead)
    monkeypatch.setattr(deletion, "datetime", Ahead)
    if portable:
        monkeypatch.setattr(Recorder, "_write_pg", lambda *a: asyncio.sleep(0, result=False))
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO projects (id, settings, created_at) VALUES ('p', '{}', now())"))
            tombstone = text("INSERT INTO tombstones VALUES ('p', 'customer-42', now()) RETURNING created_at")
            deleted_at = (await conn.execute(tombstone)).scalar_one()
        at = deleted_at.astimezone(UTC) + AHEAD  # the delete's moment on the proxy's clock
        before, after = (at - timedelta(minutes=1)).isoformat(), (at + timedelta(minutes=1)).isoformat()
        recorder = await drain(
            engine,
            tmp_path / "a",
            [
                record(0, session="customer-42", created_at=before),
                record(1, session="customer-42", created_at=after),
            ],
        )
        assert recorder.metrics.records_dropped.labels("deleted")._value.get() == 1
        # Later, another worker's copy of a call made before the delete.
        late = await drain(engine, tmp_path / "b", [record(2, session="customer-42", created_at=before)])
        assert late.metrics.records_dropped.labels("deleted")._value.get() == 1
        async with engine.connect() as conn:
            calls = (await conn.execute(text("SELECT client_request_id, session_id FROM completions"))).all()
            sessions = (await conn.execute(text("SELECT id FROM sessions"))).scalars().all()
        assert [tuple(c) for c in calls] == [("req-1", "customer-42")] and sessions == ["customer-42"]
    finally:
        await engine.dispose()
