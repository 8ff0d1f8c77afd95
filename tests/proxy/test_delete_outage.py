"""A delete while the database was down and the call still in a spool: the call never lands.

The real proxy, three times over one spool folder. Proxy A serves calls while Postgres is
unreachable for it (its database URL points at a port nobody listens on; a first start on
the real database left it the redaction policies), so they stay in its spool; it is killed.
Proxy B, on the real database, takes the deletes: a session by id and an end user, neither
of which the database has seen. Proxy C takes A's spool over and drains it: the deleted
calls are dropped by their tombstones, the rest land. A stub upstream (a fault-injection
test: no engine is needed to make calls the database cannot take).

Also through B: ``retention_days`` set by ``PUT /v1/admin/project`` and applied by the
proxy's own background loop.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.models import Completion, EndUserTombstone, Project, Tombstone
from tests.conftest import free_port
from tests.proxy.conftest import ProxyFactory, metric_sample
from tests.storage.rows import choice, insert, row


def _call(url: str, headers: dict[str, str], **body: Any) -> str:
    payload = {"model": "stub-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, **body}
    resp = httpx.post(f"{url}/v1/chat/completions", json=payload, headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.headers["x-request-id"]


def test_deleted_while_spooled_never_lands(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> None:
    db_url = pg_factory()
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    first = start_proxy(stub_upstream, db_url)  # learns the project's redaction policy, kept beside the spool
    first.stop()
    a = start_proxy(stub_upstream, unreachable, spool=first.spool)
    gone = _call(a.url, {"x-session-id": "s-gone"})
    alice = _call(a.url, {}, user="alice")  # a session of her own, named by nobody
    kept = _call(a.url, {"x-session-id": "s-kept"}, metadata={"user_id": "bob"})
    assert httpx.get(f"{a.url}/readyz", timeout=10).json()["spool"]["depth"] == 3
    a.stop("kill")

    b = start_proxy(stub_upstream, db_url, env={"ONTHEJOB_RETENTION_EVERY": "1"})  # for the retention check below
    r = httpx.delete(f"{b.v1}/admin/sessions/s-gone", timeout=10)
    assert r.status_code == 200 and r.json()["deleted"] == {"calls": 0, "feedback": 0, "dataset_items": 0}
    r = httpx.delete(f"{b.v1}/admin/end-users/alice", timeout=10)
    assert r.status_code == 200 and r.json()["sessions"] == []  # the database has not seen her session

    c = start_proxy(stub_upstream, db_url, spool=a.spool)
    c.wait_drained(timeout=60)
    eng = sync_engine(db_url)
    with Session(eng) as db:
        stored = dict(db.execute(select(Completion.id, Completion.end_user)).all())
        tombstones = set(db.scalars(select(Tombstone.session_id)))
        assert db.scalar(select(EndUserTombstone.end_user)) == "alice"
    assert stored == {kept: "bob"} and gone not in stored and alice not in stored
    assert "s-gone" in tombstones and len(tombstones) == 2  # alice's session was tombstoned at drain time
    metrics = httpx.get(f"{c.url}/metrics", timeout=10).text
    assert metric_sample(metrics, "onthejob_records_dropped_total", reason="deleted") == 2

    # Retention through B's background loop (a pass every second here; an hour by default).
    with Session(eng) as db:
        insert(db, row("ancient", [1], [choice([5, 2])], project="default"))  # 2026-01-01: older than a day
        db.commit()
    put = httpx.put(f"{b.v1}/admin/project", json={"retention_days": 1}, timeout=10)
    assert put.status_code == 200 and put.json()["settings"]["retention_days"] == 1
    assert httpx.get(f"{b.v1}/admin/project", timeout=10).json()["settings"]["retention_days"] == 1
    deadline = time.monotonic() + 30
    with Session(eng) as db:
        while db.get(Completion, "ancient") is not None and time.monotonic() < deadline:
            db.expire_all()
            time.sleep(0.2)
        assert db.get(Completion, "ancient") is None
        assert db.scalar(select(func.count()).select_from(Completion)) == 1  # the call that landed stays
        assert db.get(Project, "default") is not None
    eng.dispose()
