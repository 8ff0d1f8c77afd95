"""One envelope: every route answers errors in its API's shape, and the database down is a 503 with Retry-After.

The real `onthejob serve` whose database URL points at a port nothing listens on (auth off, so
every read route reaches the database), in front of the stub engine. Before the catch-all,
``GET /v1/chat/completions/{id}`` answered Starlette's plain-text ``Internal Server Error`` here.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.conftest import free_port
from tests.proxy.conftest import Proxy, ProxyFactory


@pytest.fixture
def no_database(start_proxy: ProxyFactory, stub_upstream: str) -> Proxy:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/gone"  # nothing listens there
    return start_proxy(stub_upstream, dead, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})


def _in_envelope(resp: httpx.Response, where: str) -> None:
    """An error answer: JSON, in the OpenAI envelope (or Anthropic's on its routes); never plain text."""
    assert resp.headers.get("content-type", "").startswith("application/json"), f"{where}: {resp.text[:200]!r}"
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body["error"]["message"], str), f"{where}: {body}"
    if resp.status_code == 503 and body["error"].get("code") == "database_unavailable":
        assert int(resp.headers["retry-after"]) > 0, where


def test_a_read_of_a_stored_call_with_the_database_down_is_a_503(no_database: Proxy) -> None:
    resp = httpx.get(f"{no_database.v1}/chat/completions/cmpl-x", timeout=30)
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "database_unavailable" and resp.headers["retry-after"] == "5"


def test_every_read_route_answers_in_the_envelope_with_the_database_down(no_database: Proxy) -> None:
    spec = httpx.get(f"{no_database.url}/openapi.json", timeout=10).json()
    reads = [path for path, ops in spec["paths"].items() if "get" in ops]
    assert len(reads) >= 15, reads
    answered: dict[int, int] = {}
    for path in reads:
        url = no_database.url + re.sub(r"\{[^}]+\}", "x", path)
        resp = httpx.get(url, timeout=30)
        answered[resp.status_code] = answered.get(resp.status_code, 0) + 1
        assert resp.status_code != 500, f"GET {path}: {resp.text[:300]}"
        if resp.status_code >= 400 and path != "/readyz":  # /readyz's 503 is its verdict, as JSON (test_readyz.py)
            _in_envelope(resp, f"GET {path}")
    assert answered.get(503, 0) >= 5, answered  # the routes that read the database said so


def test_schemathesis_finds_no_plain_text_error_with_the_database_down(no_database: Proxy) -> None:
    spec = httpx.get(f"{no_database.url}/openapi.json", timeout=10).json()
    loaded = schemathesis.openapi.from_dict(spec)
    loaded.config.update(base_url=no_database.url)
    operations = [result.ok() for result in loaded.get_all_operations()]
    for operation in operations:
        if operation.method.upper() == "POST" and operation.path.endswith(("/completions", "/messages", "/responses")):
            continue  # the call routes are served (and spooled) with the database down: tests/proxy/test_db_outage.py

        @given(case=operation.as_strategy())
        @settings(
            max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True
        )
        def check(case: Any) -> None:
            resp = case.call(timeout=30)
            where = f"{case.method} {case.formatted_path}"  # noqa: B023 - called in this iteration
            assert resp.status_code != 500, f"{where}: {resp.text[:300]}"
            if resp.status_code >= 400 and case.path != "/readyz":  # noqa: B023
                kind = {k.lower(): v for k, v in resp.headers.items()}.get("content-type", [""])  # lists here
                assert kind[0].startswith("application/json"), f"{where}: {kind} {resp.text[:300]}"
                assert "error" in resp.json(), f"{where}: {resp.text[:300]}"

        check()


def test_every_503_says_when_to_retry(start_proxy: ProxyFactory, stub_upstream: str) -> None:
    """A key that cannot be verified with the database down is a 503 too, and says when to come back."""
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/gone"
    proxy = start_proxy(stub_upstream, dead, auth=True)
    for resp in (
        httpx.get(f"{proxy.v1}/chat/completions/cmpl-x", headers={"authorization": "Bearer otj-x"}, timeout=30),
        httpx.post(
            f"{proxy.v1}/messages",
            headers={"x-api-key": "otj-x"},
            timeout=30,
            json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
        ),
    ):
        assert resp.status_code in (503, 529), resp.text  # 529: Anthropic's "overloaded" for our 503
        assert int(resp.headers["retry-after"]) > 0 and resp.json()["error"]["message"]
