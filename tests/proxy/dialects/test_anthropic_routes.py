"""Anthropic routes in front of the fault-injecting stub: errors in Anthropic's shape, nothing recorded as a success.

Bad input never reaches an engine, so the stub stands in for one here.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.proxy.conftest import ProxyFactory, make_key


def test_bad_input_gets_anthropic_errors_and_nothing_is_recorded_as_success(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    proxy, key = start_proxy(stub_upstream, db_url, auth=True), make_key(db_url)
    client = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)
    user = {"role": "user", "content": "hi"}
    cases = {
        "max_tokens": {"messages": [user]},
        "thinking.budget_tokens": {
            "max_tokens": 8,
            "messages": [user],
            "thinking": {"type": "enabled", "budget_tokens": 1024},  # not below max_tokens: the engine 400s too
        },
        "tools.0.input_schema": {"max_tokens": 8, "messages": [user], "tools": [{"name": "calc", "input_schema": "x"}]},
        "messages": {"max_tokens": 8, "messages": []},
        "messages.0.content.0.type": {
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                    ],
                }
            ],
        },
    }
    for field, request in cases.items():
        got = httpx.post(
            f"{proxy.url}/v1/messages",
            json={"model": "stub-model", **request},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
            timeout=10,
        )
        assert got.status_code == 400, got.text
        assert got.json()["type"] == "error" and got.json()["error"]["type"] == "invalid_request_error"
        assert got.json()["error"]["message"].startswith(field + ":"), got.json()
        if "max_tokens" in request:  # the SDK itself refuses to send a request without max_tokens
            with pytest.raises(anthropic.BadRequestError) as info:
                client.messages.create(model="stub-model", **request)  # type: ignore[call-overload]
            assert info.value.body["error"]["message"].startswith(field + ":")  # type: ignore[index]
    unauthorised = httpx.post(f"{proxy.url}/v1/messages", json={"max_tokens": 8, "messages": [user]}, timeout=10)
    assert unauthorised.status_code == 401 and unauthorised.json()["error"]["type"] == "authentication_error"
    proxy.wait_drained()
    listed = httpx.get(f"{proxy.v1}/chat/completions", headers={"x-api-key": key}, timeout=10).json()["data"]
    assert not [r for r in listed if r["onthejob"]["status_code"] == 200]


def test_sessions_by_path_header_and_feedback_by_message_id(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    proxy, key = start_proxy(stub_upstream, db_url, auth=True), make_key(db_url)
    by_path = anthropic.Anthropic(base_url=f"{proxy.url}/s/ticket-9", api_key=key, max_retries=0)
    raw = by_path.messages.with_raw_response.create(
        model="stub-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    message = raw.parse()
    assert raw.headers["x-session-id"] == "ticket-9" and raw.headers["x-request-id"] == message.id
    assert message.id.startswith("msg_") and message.stop_reason == "max_tokens"
    by_header = anthropic.Anthropic(
        base_url=proxy.url, api_key=key, max_retries=0, default_headers={"X-Session-Id": "ticket-10"}
    )
    assert (
        by_header.messages.with_raw_response.create(
            model="stub-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        ).headers["x-session-id"]
        == "ticket-10"
    )
    feedback = {"target": {"completion_id": message.id}, "name": "reward", "value": 1.0, "id": "fb-1"}
    got = httpx.post(f"{proxy.v1}/feedback", json=feedback, headers={"x-api-key": key}, timeout=10)
    assert got.status_code in (201, 202), got.text
    counted = httpx.post(
        f"{proxy.url}/s/ticket-9/v1/messages/count_tokens",
        headers={"x-api-key": key},
        timeout=10,
        json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert counted.status_code == 404 and counted.json()["type"] == "error"  # the stub has no tokenizer
