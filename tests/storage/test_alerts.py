"""Alerts in Postgres: one open row per key, refreshed not duplicated; open_alerts by version; resolve."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import NullPool

from storage.alerts import alert_to_dict, list_alerts, open_alerts, raise_alert, resolve_alert
from storage.db import async_engine
from storage.models import Project

pytestmark = pytest.mark.anyio


@pytest.fixture
async def adb(pg_url: str) -> AsyncIterator[AsyncSession]:
    eng = async_engine(pg_url, poolclass=NullPool)
    async with AsyncSession(eng, expire_on_commit=False) as db:
        yield db
    await eng.dispose()


async def test_open_alerts_by_version_refresh_and_resolve(adb: AsyncSession) -> None:
    import uuid

    pid, other = f"p-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    adb.add_all([Project(id=pid, settings={}), Project(id=other, settings={})])
    await adb.flush()
    first, new = await raise_alert(adb, pid, "agent", 2, "monitor", "completion_tokens", message="shorter", value=10)
    again, new_again = await raise_alert(adb, pid, "agent", 2, "monitor", "completion_tokens", message="x", value=8)
    await raise_alert(adb, pid, "agent", 3, "monitor", "timeout_rate", message="timeouts")
    await raise_alert(adb, other, "agent", 2, "monitor", "completion_tokens", message="elsewhere")
    await adb.commit()
    assert new and not new_again and again.id == first.id and again.value == 8

    assert [a.name for a in await open_alerts(adb, pid, "agent", 2)] == ["completion_tokens"]
    assert [a.version for a in await open_alerts(adb, pid, "agent", None)] == [2, 3]
    assert await open_alerts(adb, pid, "agent", 4) == []
    assert await open_alerts(adb, pid, "other-alias", None) == []

    assert await resolve_alert(adb, other, first.id, "admin") is None  # another project's id: not found
    resolved = await resolve_alert(adb, pid, first.id, "admin")
    await adb.commit()
    assert resolved is not None and alert_to_dict(resolved)["status"] == "resolved"
    assert await open_alerts(adb, pid, "agent", 2) == []
    assert len(await list_alerts(adb, pid, include_resolved=True)) == 2
    # A breach seen again after a resolve opens a fresh alert.
    _, reopened = await raise_alert(adb, pid, "agent", 2, "monitor", "completion_tokens", message="still shorter")
    assert reopened
