"""Alerts in Postgres: one open row per key, refreshed not duplicated; open_alerts by version; resolve."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import NullPool

from storage.alerts import alert_to_dict, list_alerts, open_alerts, raise_alert, resolve_alert
from storage.db import async_engine
from storage.models import Project, utcnow

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


async def test_a_window_reads_tool_errors_timeouts_grades_and_leaves_eval_out(adb: AsyncSession) -> None:
    """Sessions as the proxy records them: tool results (pattern or infra_error), cut calls, grades, eval."""
    import uuid

    from storage.feedback import new_feedback_id
    from storage.grading import DEFAULT_RULE
    from storage.models import Completion, Feedback
    from storage.monitor_store import load_window
    from storage.monitors import parse_config
    from tests.storage.rows import row

    pid = f"p-{uuid.uuid4().hex[:8]}"
    adb.add(Project(id=pid, settings={}))
    await adb.flush()
    user = {"role": "user", "content": "go"}
    tool_turn = [
        user,
        {"role": "assistant", "content": "look"},
        {"role": "tool", "content": "Error: down"},
        {"role": "tool", "content": "3 hits"},
    ]
    calls = [
        row("a1", [1], [], project=pid, session="a", adapter=1, messages=[user], at=0),
        row("a2", [1], [], project=pid, session="a", adapter=1, messages=tool_turn, at=1),
        row("b1", [1], [], project=pid, session="b", adapter=1, tags=["eval"], at=2),
        row("c1", [1], [], project=pid, session="c", adapter=1, termination="client_disconnected", at=3),
        row("d1", [1], [], project=pid, session="d", adapter=1, at=4),
        row("e1", [1], [], project=pid, session="e", adapter=2, at=5),  # another version's session
    ]
    for c in calls:
        c["id"] = f"{pid}-{c['id']}"
        c["usage"] = {"completion_tokens": 7}
    adb.add_all([Completion(**c) for c in calls])

    def grade(session: str, value: str) -> Feedback:
        return Feedback(
            id=new_feedback_id(),
            project_id=pid,
            idempotency_key=new_feedback_id(),
            name="outcome",
            target_kind="session_id",
            target_id=session,
            session_id=session,
            value=value,
            source="harness",
            attached_at=utcnow(),
        )

    adb.add_all([grade("a", "success"), grade("d", "infra_error")])
    await adb.commit()
    config = parse_config({"settle_s": 0})
    got = {s.session_id: s for s in await load_window(adb, pid, "agent", 1, config, DEFAULT_RULE)}
    assert set(got) == {"a", "c", "d"}  # b is eval traffic, e another version's
    a, c, d = got["a"], got["c"], got["d"]
    assert (a.calls, a.completion_tokens, a.answer_tokens, a.tool_results, a.tool_errors) == (2, 14, 7, 2, 1)
    assert (a.tool_calls, a.timed_out, a.graded, a.reward) == (2, False, True, 1.0)
    assert (c.timed_out, c.graded, c.reward) == (True, False, 0.0)  # the proxy saw it cut: a failure, ungraded
    assert (d.tool_errors, d.graded, d.reward) == (1, True, None)  # infra_error: an error, masked
