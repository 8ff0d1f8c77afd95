"""Faults the real engine cannot produce on demand, injected by the stub upstream.

The proxy must stay up, answer with the documented 502/504 envelopes (or an
error event mid-stream), and record every call with its termination reason.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.models import Completion
from tests.proxy.conftest import Proxy, ProxyFactory

IDLE = "1"


@pytest.fixture
def proxy(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> Proxy:
    return start_proxy(stub_upstream, pg_factory(), env={"ONTHEJOB_IDLE_TIMEOUT": IDLE})


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, **extra}


def _row(proxy: Proxy, cid: str) -> Completion:
    proxy.wait_drained()
    eng = sync_engine(proxy.db_url)
    with Session(eng) as db:
        row = db.scalar(select(Completion).where(Completion.id == cid))
    eng.dispose()
    assert row is not None, f"{cid} was not recorded"
    return row


def _stream(proxy: Proxy, body: dict[str, Any]) -> tuple[str, list[str]]:
    with httpx.stream("POST", f"{proxy.v1}/chat/completions", json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        return resp.headers["x-request-id"], [line for line in resp.iter_lines() if line]


@pytest.mark.parametrize(
    ("fault", "status", "termination"),
    [("500", 502, "upstream_error"), ("reset", 502, "upstream_error"), ("stall", 504, "timeout")],
)
def test_non_streamed_faults(proxy: Proxy, fault: str, status: int, termination: str) -> None:
    resp = httpx.post(f"{proxy.v1}/chat/completions", json=_body(stub_fault=fault), timeout=30)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert error["message"] and error["type"] in ("upstream_error", "timeout_error")
    row = _row(proxy, resp.headers["x-request-id"] if "x-request-id" in resp.headers else _last_id(proxy))
    assert row.termination == termination and row.status_code == status and row.error


def _last_id(proxy: Proxy, timeout: float = 15.0) -> str:
    """The newest recorded id, waiting for a record to land (the proxy records some faults late)."""
    deadline = time.monotonic() + timeout
    eng = sync_engine(proxy.db_url)
    try:
        while time.monotonic() < deadline:
            with Session(eng) as db:
                cid = db.scalar(select(Completion.id).order_by(Completion.created_at.desc()).limit(1))
            if cid:
                return cid
            time.sleep(0.1)
    finally:
        eng.dispose()
    raise AssertionError("no record landed")


@pytest.mark.parametrize(
    ("fault", "termination"),
    [("reset_midstream", "upstream_error"), ("stall_midstream", "timeout"), ("malformed", "upstream_error")],
)
def test_streamed_faults_end_with_an_error_event_and_a_partial_record(
    proxy: Proxy, fault: str, termination: str
) -> None:
    cid, lines = _stream(proxy, _body(stub_fault=fault, max_tokens=8, stub_gap_ms=30))
    assert lines[-1] == "data: [DONE]"
    assert '"error"' in lines[-2]
    row = _row(proxy, cid)
    assert row.termination == termination and row.error
    assert 0 < len(row.choices[0]["token_ids"]) < 8  # the part that arrived is kept, token-exact


def test_refused_connection_is_a_502_and_the_proxy_stays_up(start_proxy: ProxyFactory, pg_factory: Any) -> None:
    from tests.conftest import free_port

    proxy = start_proxy(f"http://127.0.0.1:{free_port()}", pg_factory())
    resp = httpx.post(f"{proxy.v1}/chat/completions", json=_body(), timeout=30)
    # No engine ever answered, so the alias is unknown: the proxy says so rather than hang.
    assert resp.status_code in (404, 502)
    ready = httpx.get(f"{proxy.url}/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
    assert httpx.get(f"{proxy.url}/healthz", timeout=5).status_code == 200


def test_client_disconnect_cancels_upstream_and_records_the_partial(proxy: Proxy, stub_upstream: str) -> None:
    before = httpx.get(f"{stub_upstream}/stub/stats", timeout=5).json()
    with httpx.stream(
        "POST", f"{proxy.v1}/chat/completions", timeout=30, json=_body(stream=True, max_tokens=50, stub_gap_ms=100)
    ) as resp:
        cid = resp.headers["x-request-id"]
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few chunks, then hang up
    assert any(line.startswith("data:") for line in got)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = httpx.get(f"{stub_upstream}/stub/stats", timeout=5).json()
        if after["cancelled"] > before["cancelled"]:
            break
        time.sleep(0.1)
    assert after["cancelled"] == before["cancelled"] + 1, "the upstream request was not cancelled"
    row = _row(proxy, cid)
    assert row.termination == "client_disconnected"
    assert 0 < len(row.choices[0]["token_ids"]) < 50


def test_disconnect_before_the_first_token(proxy: Proxy) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{proxy.v1}/chat/completions", json=_body(stub_fault="stall", stream=True), timeout=0.5)
    assert httpx.get(f"{proxy.url}/healthz", timeout=5).status_code == 200
    cid = _last_id(proxy)
    row = _row(proxy, cid)
    assert row.termination == "client_disconnected"


def test_the_engine_shapes_pass_through_for_completions_and_usage(proxy: Proxy) -> None:
    cid, lines = _stream(proxy, _body(stream_options={"include_usage": True}))
    assert '"usage"' in lines[-2]
    cid2, lines2 = _stream(proxy, _body())
    assert all('"usage":{' not in line for line in lines2)
    assert _row(proxy, cid2).usage["completion_tokens"] == 6  # recorded even though the client did not ask
