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
        "messages.0.content.0.tool_use_id": {"max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]},
        "tools.0.input_schema": {"max_tokens": 8, "messages": [user], "tools": [{"name": "calc", "input_schema": "x"}]},
        "messages": {"max_tokens": 8, "messages": []},
        "messages.0.content.0.type": {"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
    }  # fmt: skip
    for field, request in cases.items():
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="stub-model", **request)  # type: ignore[call-overload]
        assert info.value.status_code == 400
        assert info.value.body["type"] == "error"  # type: ignore[index]
        assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert info.value.body["error"]["message"].startswith(field + ":"), info.value.body  # type: ignore[index]
    unauthorised = httpx.post(f"{proxy.url}/v1/messages", json={"max_tokens": 8, "messages": [user]}, timeout=10)
    assert unauthorised.status_code == 401 and unauthorised.json()["error"]["type"] == "authentication_error"
    proxy.wait_drained()
    listed = httpx.get(f"{proxy.v1}/chat/completions", headers={"x-api-key": key}, timeout=10).json()["data"]
    assert not [r for r in listed if r["onthejob"]["status_code"] == 200]
