"""A property of the edge: for each stored client-supplied field, a generated value is refused (400 naming
the field) or recorded; none is answered 200 and lost.

Lengths around the limits, unicode, NUL, wrong types; the real proxy and Postgres, the stub engine
(this is our edge, not the model). The 200s are checked once, after one drain, against the database.

Every call route is tried, each authenticated as its own clients do: chat completions, Anthropic's
messages, OpenAI's responses and Gemini's ``generateContent``. Google's request has no ``metadata``
or ``user`` field, but the edge reads them from every dialect's body as sent (proxy/admission.py
``check_call``, proxy/link_keys.py ``naming``), so a Gemini call carries the same stored fields as
the others (the id headers, ``/s/{id}/`` and those body fields) and is tried on each; its refusals
come in Google's error shape, the field named in a ``google.rpc.BadRequest`` violation.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session

from proxy import admission
from storage.db import sync_engine
from storage.models import Completion
from tests.proxy.conftest import Proxy, ProxyFactory, make_key

EXAMPLES = int(os.environ.get("ONTHEJOB_FUZZ_EXAMPLES", "12"))
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GEMINI = "/v1beta/models/stub-model:generateContent"
# Each dialect's route, one body: every one is admitted by the same edge check (proxy/handle.py).
ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/messages": CHAT,
    "/v1/responses": {"model": "stub-model", "input": "hi", "max_output_tokens": 2},
    GEMINI: {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 2}},
}
# The header each route's clients send their key in (the Gemini dialect reads x-goog-api-key as Bearer).
KEY_HEADERS = {"/v1/messages": "x-api-key", GEMINI: "x-goog-api-key"}
LIMIT = admission.SESSION_ID_CHARS  # every id column here holds 200

# Header values: what HTTP carries (latin-1, no control characters), around the limit.
latin1 = st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x7f")
header_text = st.text(latin1, min_size=1, max_size=12) | st.integers(LIMIT - 2, LIMIT + 2).flatmap(
    lambda n: st.text(latin1, min_size=n, max_size=n)
)
near_limit = st.integers(LIMIT - 2, LIMIT + 2).flatmap(lambda n: st.text(min_size=n, max_size=n))
body_text = st.text(max_size=40) | near_limit | st.just("a\x00b") | st.just("é" * LIMIT + "ü")
numbers = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
containers = st.lists(st.text(max_size=3), max_size=3) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
wrong = st.none() | st.booleans() | numbers | containers
any_value = body_text | wrong
tag_lists = st.lists(body_text | st.integers(), max_size=4) | st.lists(
    st.text(min_size=1, max_size=3), min_size=99, max_size=102
)

# (field, where it goes, values)
FIELDS: list[tuple[str, str, Any]] = [
    ("X-Client-Request-Id", "header", header_text),
    ("X-Session-Id", "header", header_text),
    ("X-Task-Id", "header", header_text),
    ("X-Onthejob-Tags", "header", header_text),
    ("session_id", "path", body_text.filter(lambda s: "/" not in s and s.strip() not in ("", ".", ".."))),
    ("metadata.session_id", "metadata", any_value),
    ("metadata.task_id", "metadata", any_value),
    ("metadata.tags", "metadata", any_value | tag_lists),
    ("metadata.user_id", "metadata", any_value),
    ("metadata.end_user", "metadata", any_value),
    ("user", "body", any_value),
    ("metadata", "body", wrong),
]


@pytest.fixture
def served(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> tuple[Proxy, str]:
    """The proxy, with keys required, and a key to call it with."""
    db_url = pg_factory()
    proxy = start_proxy(stub_upstream, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    return proxy, make_key(db_url)


def _send(
    client: httpx.Client, proxy: Proxy, key: str, route: str, field: str, where: str, value: Any
) -> httpx.Response:
    body: dict[str, Any] = dict(ROUTES[route])
    key_header = KEY_HEADERS.get(route, "authorization")
    headers = {key_header: (key if key_header != "authorization" else f"Bearer {key}").encode()}
    url = f"{proxy.url}{route}"
    if where == "header":
        headers[field.lower()] = value.encode("latin-1")  # what HTTP carries: bytes, read back as latin-1
    elif where == "path":
        url = f"{proxy.url}/s/{quote(value, safe='')}{route}"
    elif where == "metadata":
        body["metadata"] = {field.split(".", 1)[1]: value}
    else:
        body[field] = value
    return client.post(url, json=body, headers=headers)


def _field_named(route: str, error: dict[str, Any]) -> str | None:
    """The field a 400 names: OpenAI's and Anthropic's ``param``, or Google's field violation (its status checked)."""
    if route != GEMINI:
        return error.get("param")
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT"), error
    return error["details"][0]["fieldViolations"][0]["field"]


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_value_is_refused_or_recorded(served: tuple[Proxy, str], route: str) -> None:
    proxy, key = served
    answered: dict[str, tuple[str, Any]] = {}  # call id -> (field, the value it was answered 200 for)
    refused: dict[str, int] = {}
    with httpx.Client(timeout=30) as client:
        for field, where, values in FIELDS:

            @given(value=values)
            @settings(
                max_examples=2 * EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
                derandomize=True,
            )
            def check(value: Any) -> None:
                resp = _send(client, proxy, key, route, field, where, value)  # noqa: B023 - called in this iteration
                what = f"{field}={value!r}"  # noqa: B023
                assert resp.status_code in (200, 400), f"{what}: {resp.status_code} {resp.text[:300]}"
                if resp.status_code == 400:
                    error = resp.json()["error"]
                    named = _field_named(route, error) == field or field in error["message"]  # noqa: B023
                    assert named, (what, error)
                    refused[field] = refused.get(field, 0) + 1  # noqa: B023
                else:
                    answered[resp.headers["x-request-id"]] = (field, value)  # noqa: B023

            check()
    proxy.wait_drained(timeout=60)
    eng = sync_engine(proxy.db_url)
    with Session(eng) as db:
        rows = {r.id: r for r in db.scalars(select(Completion).where(Completion.id.in_(list(answered))))}
    eng.dispose()
    lost = {call: value for call, value in answered.items() if call not in rows}
    assert not lost, f"answered 200, never recorded: {lost}"
    assert not list(proxy.spool.parent.rglob("quarantine*")), "a record the database refused"
    for call, (field, value) in answered.items():
        if field == "X-Client-Request-Id":  # the column holds what the client sent
            assert rows[call].client_request_id == value
    # Both sides were reached: every field had a refused value and most an admitted one.
    assert set(refused) == {f for f, _, _ in FIELDS}, refused
    assert len({f for f, _ in answered.values()}) >= len(FIELDS) - 1, answered
