"""The soak's probes (bench/soak.py): client input at the edges of admission, and reads, one at a time.

Each is answered 200 (a call answered 200 must then be recorded like any other) or with an error in its
dialect's shape; which status is right is the tests' business, not the soak's. The reads run more often
while the database is down (their answer then: 503 in the envelope, with Retry-After).
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

from bench.soak_log import Call

ALIAS = "agent"
CHAT = "/v1/chat/completions"


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": ALIAS, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}


def _requests(proxy: str, rng: random.Random, calls: list[Call]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(name, method, url, httpx keywords) of every probe, built now."""
    n = rng.randrange(1_000_000)
    known = next((c.rid for c in reversed(calls[-50:]) if c.rid and c.kind == "chat"), None) or "cmpl-unknown"
    session = {"x-session-id": f"probe-{n}"}
    return [
        ("bad_metadata", "POST", CHAT, {"json": _chat("m", metadata={"tags": 5}), "headers": session}),
        (
            "long_client_request_id",
            "POST",
            CHAT,
            {"json": _chat("c"), "headers": {**session, "x-client-request-id": "r" * 300}},
        ),
        ("long_session_id", "POST", CHAT, {"json": _chat("s"), "headers": {"x-session-id": "s" * 300}}),
        ("unknown_model", "POST", CHAT, {"json": {**_chat("u"), "model": "nope"}, "headers": session}),
        (
            "malformed_json",
            "POST",
            CHAT,
            {
                "content": b'{"model": "agent", "messages": [',
                "headers": {**session, "content-type": "application/json"},
            },
        ),
        ("wrong_type", "POST", CHAT, {"json": {**_chat("w"), "max_tokens": "many"}, "headers": session}),
        (
            "anthropic_ok",
            "POST",
            "/v1/messages",
            {
                "json": {"model": ALIAS, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                "headers": session,
            },
        ),
        ("anthropic_bad", "POST", "/v1/messages", {"json": {"model": ALIAS, "messages": "no"}, "headers": session}),
        ("read_call", "GET", f"/v1/chat/completions/{known}", {}),
        ("read_unknown_call", "GET", f"/v1/chat/completions/cmpl-{n}", {}),
        ("read_session", "GET", f"/v1/sessions/customer-{n % 24}", {}),
        ("read_feedback", "GET", "/v1/feedback", {"params": {"session_id": f"customer-{n % 24}"}}),
        ("read_adapters", "GET", "/v1/admin/adapters", {}),
        ("read_deployments", "GET", "/v1/admin/deployments", {}),
    ]


async def send(http: httpx.AsyncClient, call: Call, method: str, url: str, **kw: Any) -> Call:
    """Make one request; fill in its answer (the body only when it is an error)."""
    try:
        resp = await http.request(method, url, **kw)
        call.status, call.content_type = resp.status_code, resp.headers.get("content-type", "")
        call.rid = resp.headers.get("x-request-id")
        call.complete = resp.status_code == 200
        if resp.status_code >= 300:
            call.body = resp.content
    except httpx.HTTPError as exc:
        call.detail = f"{type(exc).__name__}: {exc}"
    call.t_done = time.time()
    return call


async def stream(http: httpx.AsyncClient, call: Call, url: str, body: dict[str, Any], headers: dict[str, str]) -> Call:
    try:
        async with http.stream("POST", url, json=body, headers=headers) as resp:
            call.status, call.content_type = resp.status_code, resp.headers.get("content-type", "")
            call.rid = resp.headers.get("x-request-id")
            data = await resp.aread()
        if resp.status_code >= 300:
            call.body = data
        call.complete = resp.status_code == 200 and data.rstrip().endswith(b"data: [DONE]") and b'"error"' not in data
        if resp.status_code == 200 and not call.complete:
            call.detail, call.body = "stream cut or error event", data[-300:]
    except httpx.HTTPError as exc:
        call.detail = f"{type(exc).__name__}: {exc}"
    call.t_done = time.time()
    return call


async def probe_once(http: httpx.AsyncClient, proxy: str, rng: random.Random, calls: list[Call]) -> Call:
    name, method, path, kw = rng.choice(_requests(proxy, rng, calls))
    call = Call(f"probe_{name}", None, None, time.time(), dialect="anthropic" if "/v1/messages" in path else "openai")
    await send(http, call, method, proxy + path, **kw)
    if method == "GET":  # a read is no call: nothing of it is to be recorded
        call.rid, call.complete = None, False
    return call
