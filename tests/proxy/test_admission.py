"""Admission: a value the record cannot store is a 400 naming the field, before the engine is called.

The limits come from the storage columns; each check is one function of proxy/admission.py; the
call routes of every dialect answer them in their own error shape. The real proxy, Postgres and
the stub engine (these are our edge's answers, not the model's).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from proxy import admission
from proxy.errors import InvalidRequest
from storage.db import sync_engine
from storage.models import Completion
from tests.proxy.conftest import Proxy, ProxyFactory

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES = {"model": "stub-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "stub-model", "input": "hi", "max_output_tokens": 2}


def test_limits_are_the_columns() -> None:
    columns = Completion.__table__.c
    assert admission.CLIENT_REQUEST_ID_CHARS == columns.client_request_id.type.length == 200
    assert admission.SESSION_ID_CHARS == columns.session_id.type.length == 200
    assert admission.TASK_ID_CHARS == columns.task_id.type.length == 200


@pytest.mark.parametrize(
    ("headers", "body", "path", "field"),
    [
        ({"x-client-request-id": "r" * 201}, {}, None, "X-Client-Request-Id"),
        ({"x-session-id": "s" * 201}, {}, None, "X-Session-Id"),
        ({"x-task-id": "t" * 201}, {}, None, "X-Task-Id"),
        ({"x-onthejob-tags": "a," + "b" * 201}, {}, None, "X-Onthejob-Tags"),
        ({"x-onthejob-tags": ",".join(map(str, range(101)))}, {}, None, "X-Onthejob-Tags"),
        ({}, {"metadata": {"tags": 5}}, None, "metadata.tags"),
        ({}, {"metadata": {"tags": [1]}}, None, "metadata.tags"),
        ({}, {"metadata": {"tags": {"a": 1}}}, None, "metadata.tags"),
        ({}, {"metadata": {"tags": ["a\x00b"]}}, None, "metadata.tags"),
        ({}, {"metadata": {"session_id": {"a": 1}}}, None, "metadata.session_id"),
        ({}, {"metadata": {"session_id": "a\x00b"}}, None, "metadata.session_id"),
        ({}, {"metadata": {"task_id": 1.5}}, None, "metadata.task_id"),
        ({}, {"metadata": {"user_id": ["x"]}}, None, "metadata.user_id"),
        ({}, {"metadata": {"end_user": True}}, None, "metadata.end_user"),
        ({}, {"user": {"id": 1}}, None, "user"),
        ({}, {"metadata": "tags=a"}, None, "metadata"),
        ({}, {}, "p" * 201, "session_id"),
    ],
)
def test_each_check_names_its_field(
    headers: dict[str, str], body: dict[str, Any], path: str | None, field: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        admission.check_call(headers, body, path)
    assert info.value.param == field and field in info.value.message


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"x-client-request-id": "r" * 200, "x-session-id": "s" * 200, "x-task-id": "t" * 200}, {}),
        ({"x-onthejob-tags": " eval , b "}, {"metadata": {"tags": ["x" * 200] * 100}}),
        ({}, {"metadata": {"session_id": 42, "task_id": "t", "user_id": "u" * 5000, "other": [1, {"a": None}]}}),
        ({}, {"metadata": None, "user": "a\x00b"}),  # an end user is stored as its hash when a column cannot hold it
    ],
)
def test_what_the_record_holds_is_admitted(headers: dict[str, str], body: dict[str, Any]) -> None:
    admission.check_call(headers, body, None)


@pytest.fixture
def proxy(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> Proxy:
    return start_proxy(stub_upstream, pg_factory(), env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})


def _stored(proxy: Proxy, call_id: str) -> Completion | None:
    proxy.wait_drained()
    eng = sync_engine(proxy.db_url)
    with Session(eng) as db:
        row = db.scalar(select(Completion).where(Completion.id == call_id))
    eng.dispose()
    return row


def test_an_overlong_client_request_id_is_a_400_not_a_200_then_lost(proxy: Proxy, stub_upstream: str) -> None:
    """Before: answered 200, then COPY failed on the String(200) column and the record was quarantined."""
    before = httpx.get(f"{stub_upstream}/stub/stats", timeout=5).json()
    resp = httpx.post(f"{proxy.v1}/chat/completions", json=CHAT, headers={"x-client-request-id": "r" * 300}, timeout=10)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "X-Client-Request-Id" and error["type"] == "invalid_request_error"
    assert "300 characters" in error["message"] and "200" in error["message"]
    assert httpx.get(f"{stub_upstream}/stub/stats", timeout=5).json() == before  # the engine was not called
    ok = httpx.post(f"{proxy.v1}/chat/completions", json=CHAT, headers={"x-client-request-id": "r" * 200}, timeout=10)
    assert ok.status_code == 200, ok.text
    row = _stored(proxy, ok.headers["x-request-id"])
    assert row is not None and row.client_request_id == "r" * 200


def test_metadata_tags_of_the_wrong_type_are_the_clients_400(proxy: Proxy) -> None:
    """Before: ``metadata: {"tags": 5}`` answered 500 (iterating an int while naming the session)."""
    resp = httpx.post(f"{proxy.v1}/chat/completions", json={**CHAT, "metadata": {"tags": 5}}, timeout=10)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "metadata.tags"
    listed = httpx.post(f"{proxy.v1}/chat/completions", json={**CHAT, "metadata": {"tags": ["a", "b"]}}, timeout=10)
    assert listed.status_code == 200, listed.text
    row = _stored(proxy, listed.headers["x-request-id"])
    assert row is not None and row.tags == ["a", "b"]


def test_dialects_answer_admission_in_their_own_shape(proxy: Proxy) -> None:
    """Anthropic's Messages and OpenAI's Responses go through the same edge check (before: 200 then lost, 500)."""
    long_id = {"x-client-request-id": "r" * 300}
    messages = httpx.post(f"{proxy.v1}/messages", json=MESSAGES, headers=long_id, timeout=10)
    assert messages.status_code == 400, messages.text
    body = messages.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "X-Client-Request-Id" in body["error"]["message"]
    tags = httpx.post(f"{proxy.v1}/responses", json={**RESPONSES, "metadata": {"tags": 5}}, timeout=10)
    assert tags.status_code == 400, tags.text
    assert tags.json()["error"]["param"] == "metadata.tags"
    user = httpx.post(f"{proxy.v1}/messages", json={**MESSAGES, "metadata": {"user_id": {"id": 1}}}, timeout=10)
    assert user.status_code == 400 and "metadata.user_id" in user.json()["error"]["message"], user.text


def test_a_session_id_no_header_can_carry_is_answered_encoded(proxy: Proxy) -> None:
    """Before: recorded, then answered 500 (a response header holds latin-1 only; a newline would split it)."""
    name = "café ☕\nnext"
    resp = httpx.post(f"{proxy.v1}/chat/completions", json={**CHAT, "metadata": {"session_id": name}}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-session-id"] == "caf%C3%A9 %E2%98%95%0Anext"
    row = _stored(proxy, resp.headers["x-request-id"])
    assert row is not None and row.session_id == name


def test_a_named_call_id_is_text_a_call_id_can_be() -> None:
    """For a dialect's ``previous_response_id`` (proxy/dialects/responses.py restates its own check today)."""
    assert admission.call_id("resp_" + "a" * 59, "previous_response_id")
    for bad in ("a" * 65, "a\x00b", "", 5, None):
        with pytest.raises(InvalidRequest) as info:
            admission.call_id(bad, "previous_response_id")
        assert info.value.param == "previous_response_id"
