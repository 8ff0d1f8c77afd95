"""A deleted session's id used again: the later calls are answered 200 and recorded, as a fresh session.

The real proxy on the real database. Harnesses name sessions (``customer-42``) and end users
(``alice``) with ids they reuse; a delete removes what was recorded and suppresses only calls made
before it (a copy still in a spool: tests/proxy/test_delete_outage.py, tests/proxy/test_recorder.py).
Also: the worker that took the delete no longer links a follow-up of the deleted conversation to it.
A stub upstream: this is about recording and session resolution, not the model (as test_linking_workers).
"""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.models import Completion, Tombstone
from storage.models import Session as SessionRow
from tests.proxy.conftest import ProxyFactory, metric_sample


def _call(url: str, headers: dict[str, str], messages: list[dict[str, Any]] | None = None, **body: Any) -> Any:
    payload = {"model": "stub-model", "messages": messages or [{"role": "user", "content": "x"}], "max_tokens": 3}
    resp = httpx.post(f"{url}/v1/chat/completions", json={**payload, **body}, headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp


def _stored(db_url: str) -> dict[str, tuple[str, str | None]]:
    eng = sync_engine(db_url)
    try:
        with Session(eng) as db:
            return {
                i: (s, p) for i, s, p in db.execute(select(Completion.id, Completion.session_id, Completion.parent_id))
            }
    finally:
        eng.dispose()


def test_a_session_deleted_then_named_again_is_recorded_afresh(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    proxy = start_proxy(stub_upstream, db_url)
    first = _call(proxy.url, {"x-session-id": "customer-42"}).headers["x-request-id"]
    proxy.wait_drained(timeout=60)
    r = httpx.delete(f"{proxy.v1}/admin/sessions/customer-42", timeout=10)
    assert r.status_code == 200 and r.json()["deleted"]["calls"] == 1

    later = _call(proxy.url, {"x-session-id": "customer-42"}).headers["x-request-id"]
    proxy.wait_drained(timeout=60)
    assert _stored(db_url) == {later: ("customer-42", None)} and first != later
    eng = sync_engine(db_url)
    with Session(eng) as db:
        assert db.get(SessionRow, ("default", "customer-42")) is not None  # the session exists again
        assert db.scalar(select(Tombstone.session_id)) == "customer-42"  # and still keeps older copies out
    eng.dispose()
    metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert not metric_sample(metrics, "onthejob_records_dropped_total", reason="deleted")


def test_an_end_user_deleted_then_calling_again_is_recorded_afresh(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    proxy = start_proxy(stub_upstream, db_url)
    _call(proxy.url, {"x-session-id": "customer-7"}, user="alice")
    _call(proxy.url, {}, user="alice")
    proxy.wait_drained(timeout=60)
    r = httpx.delete(f"{proxy.v1}/admin/end-users/alice", timeout=10)
    assert r.status_code == 200 and "customer-7" in r.json()["sessions"] and r.json()["deleted"]["calls"] == 2

    named = _call(proxy.url, {"x-session-id": "customer-7"}, user="alice").headers["x-request-id"]
    unnamed = _call(proxy.url, {}, user="alice").headers["x-request-id"]
    proxy.wait_drained(timeout=60)
    stored = _stored(db_url)
    assert set(stored) == {named, unnamed} and stored[named] == ("customer-7", None)


def test_the_deleting_worker_does_not_link_a_follow_up_to_the_deleted_session(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    proxy = start_proxy(stub_upstream, db_url)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "a conversation of its own"}]
    turn1 = _call(proxy.url, {}, messages)
    proxy.wait_drained(timeout=60)
    ((deleted, _),) = _stored(db_url).values()
    assert httpx.delete(f"{proxy.v1}/admin/sessions/{deleted}", timeout=10).status_code == 200

    # The next turn continues the deleted conversation: its parent is in this worker's link cache.
    messages += [turn1.json()["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    turn2 = _call(proxy.url, {}, messages).headers["x-request-id"]
    proxy.wait_drained(timeout=60)
    stored = _stored(db_url)
    assert set(stored) == {turn2}
    session, parent = stored[turn2]
    assert session != deleted and parent is None  # a new session, linked to nothing
