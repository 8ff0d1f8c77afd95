"""Keys hashed at rest, roles, rate limits, redaction that reaches every stored copy, CORS off."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session

from proxy.errors import RateLimited
from proxy.ratelimit import RateLimiter
from proxy.redact import MASK, RedactionPolicy, redact_record
from storage.db import sync_engine
from tests.proxy.conftest import Proxy, ProxyFactory, make_key

SECRET = "sk-PLANTEDsecret0123456789"


def test_token_bucket_refuses_with_openai_headers() -> None:
    limiter = RateLimiter(rate=1000.0, burst=3)
    for _ in range(3):
        limiter.check("k")
    with pytest.raises(RateLimited) as info:
        limiter.check("k")
    assert info.value.status == 429 and info.value.headers["x-ratelimit-remaining-requests"] == "0"
    limiter.check("another-key")  # buckets are per key
    time.sleep(0.01)
    limiter.check("k")  # refilled
    RateLimiter(rate=0, burst=1).check("k")  # off


def test_workers_share_the_hosts_rate_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker keeps its own buckets and leases its share (proxy/ratelimit.py): before its first lease,
    under --workers 4, each enforces a quarter, so the host allows 1x."""
    from proxy.main import worker_env
    from proxy.ratelimit import fallback_share
    from proxy.settings import Settings

    settings = Settings(upstreams=["http://a:1"], spool_dir=tmp_path, rate_limit_rps=50.0, rate_limit_burst=100)
    for name, value in worker_env(settings, 4).items():
        monkeypatch.setenv(name, value)
    worker = Settings()  # what each worker process builds
    assert (worker.rate_limit_rps, worker.rate_limit_burst, worker.workers) == (50.0, 100, 4)
    assert worker.host_id == settings.host_id  # one id for the process tree
    assert fallback_share(worker.rate_limit_rps, 1, worker.workers) * 4 == 50.0


def test_redaction_reaches_every_text_field_and_keeps_token_ids() -> None:
    record = {
        "id": "cmpl-1",
        "request": {"messages": [{"role": "user", "content": f"key {SECRET} here"}]},
        "response": {
            "choices": [
                {
                    "message": {"role": "assistant", "content": SECRET},
                    "logprobs": {"content": [{"token": SECRET[:5], "bytes": [115, 107]}]},
                }
            ]
        },
        "choices": [{"token_ids": [1, 2], "logprobs": [-0.1, -0.2], "message": {"content": SECRET}}],
        "error": None,
        "prompt_token_ids": [5, 6],
    }
    patterns = redact_record(record, RedactionPolicy(patterns=(re.compile(r"sk-[A-Za-z0-9]+"),)))
    assert SECRET not in str(patterns) and "key [redacted] here" in str(patterns)
    # Patterns reach ids too: this choice spelled the secret (no per-token pieces: all of it), so did the prompt.
    assert patterns["choices"][0]["token_ids"] == [-1, -1] and patterns["prompt_token_ids"] is None
    none = redact_record(record, RedactionPolicy(store_text=False))
    assert SECRET not in str(none) and SECRET[:5] not in str(none)
    assert none["choices"][0]["token_ids"] == [1, 2] and none["prompt_token_ids"] == [5, 6]
    assert none["request"]["messages"][0] == {"role": "user", "content": MASK}


@pytest.fixture
def secured(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> tuple[Proxy, str, str]:
    db_url = pg_factory()
    harness, admin = make_key(db_url, "acme", "harness"), make_key(db_url, "acme", "admin")
    proxy = start_proxy(
        stub_upstream, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "5", "ONTHEJOB_RATE_LIMIT_BURST": "10"}
    )
    return proxy, harness, admin


def _dump_database(db_url: str) -> str:
    """Every value of every row of every table, as one string."""
    eng = sync_engine(db_url)
    meta = MetaData()
    meta.reflect(eng)
    parts = []
    with Session(eng) as db:
        for table in meta.sorted_tables:
            parts.extend(repr(tuple(row)) for row in db.execute(select(table)))
    eng.dispose()
    return "\n".join(parts)


def test_roles_keys_at_rest_and_rate_limits(secured: tuple[Proxy, str, str]) -> None:
    proxy, harness, admin = secured
    as_harness = {"authorization": f"Bearer {harness}"}
    assert httpx.get(f"{proxy.v1}/models", timeout=5).status_code == 401
    bad = httpx.get(f"{proxy.v1}/models", headers={"authorization": "Bearer otj-wrong"}, timeout=5)
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    # Anthropic clients send the key as x-api-key: the same key, the same checks, on routes and calls alike.
    assert httpx.get(f"{proxy.v1}/models", headers={"x-api-key": harness}, timeout=5).status_code == 200
    assert httpx.get(f"{proxy.v1}/models", headers={"x-api-key": "otj-wrong"}, timeout=5).status_code == 401
    chat = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    assert (
        httpx.post(f"{proxy.v1}/chat/completions", json=chat, headers={"x-api-key": harness}, timeout=10).status_code
        == 200
    )
    forbidden = httpx.get(f"{proxy.v1}/admin/keys", headers=as_harness, timeout=5)
    assert forbidden.status_code == 403 and "admin" in forbidden.json()["error"]["message"]
    listed = httpx.get(f"{proxy.v1}/admin/keys", headers={"authorization": f"Bearer {admin}"}, timeout=5).json()
    assert {k["project"] for k in listed["data"]} == {"acme"}
    assert harness not in str(listed) and admin not in str(listed)
    dump = _dump_database(proxy.db_url)
    assert harness not in dump and admin not in dump, "a key is stored in plain text"
    assert harness not in proxy.log.read_text()

    async def burst() -> list[httpx.Response]:  # at once: one after another, a slow machine refills the bucket
        async with httpx.AsyncClient(timeout=10) as c:
            return await asyncio.gather(*(c.get(f"{proxy.v1}/models", headers=as_harness) for _ in range(15)))

    statuses = asyncio.run(burst())
    limited = [r for r in statuses if r.status_code == 429]
    assert limited, "15 calls at once should exceed a burst of 10"
    assert limited[0].headers["x-ratelimit-remaining-requests"] == "0" and "retry-after" in limited[0].headers
    assert limited[0].json()["error"]["type"] == "rate_limit_error"


def _spool_text(spool: Path) -> str:
    """Every spool segment's text now (a segment the recorder drained and removed meanwhile is skipped)."""
    parts = []
    for path in spool.rglob("*.jsonl"):
        try:
            parts.append(path.read_text(errors="replace"))
        except FileNotFoundError:
            continue
    return "".join(parts)


def test_redaction_policy_leaves_no_copy_anywhere(secured: tuple[Proxy, str, str]) -> None:
    proxy, harness, admin = secured
    as_admin = {"authorization": f"Bearer {admin}"}
    bad = httpx.put(f"{proxy.v1}/admin/project", headers=as_admin, json={"redact": {"patterns": ["("]}}, timeout=5)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "redact.patterns"
    ok = httpx.put(
        f"{proxy.v1}/admin/project",
        headers=as_admin,
        json={"redact": {"store_text": True, "patterns": [r"sk-[A-Za-z0-9]+"]}},
        timeout=5,
    )
    assert ok.status_code == 200
    body = {
        "model": "stub-model",
        "messages": [{"role": "user", "content": f"my key is {SECRET}"}],
        "max_tokens": 3,
        "metadata": {"note": SECRET},
    }
    resp = httpx.post(
        f"{proxy.v1}/chat/completions", json=body, headers={"authorization": f"Bearer {harness}"}, timeout=10
    )
    assert resp.status_code == 200
    spool_text = _spool_text(proxy.spool)
    proxy.wait_drained()
    dump = _dump_database(proxy.db_url)
    assert "my key is [redacted]" in dump, "the record should be stored, redacted"
    assert SECRET not in dump and SECRET not in spool_text and SECRET not in proxy.log.read_text()
    stored = httpx.get(
        f"{proxy.v1}/chat/completions/{resp.headers['x-request-id']}",
        headers={"authorization": f"Bearer {harness}"},
        timeout=5,
    ).json()
    # The prompt spelled the secret: its ids are not kept (proxy/redact_tokens.py); the sampled ones did not.
    assert stored["onthejob"]["prompt_token_ids"] is None
    assert stored["onthejob"]["completion_token_ids"] == [[100, 101, 102]]


def test_cors_is_off_by_default(secured: tuple[Proxy, str, str]) -> None:
    proxy, _, _ = secured
    headers = {"origin": "https://evil.example", "access-control-request-method": "POST"}
    pre = httpx.options(f"{proxy.v1}/chat/completions", timeout=5, headers=headers)
    assert "access-control-allow-origin" not in pre.headers


def test_an_admin_key_from_the_environment_is_registered_once(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    chosen = "otj-operator-chosen-0123456789abcdef"
    env = {"ONTHEJOB_ADMIN_KEY": chosen}
    proxy = start_proxy(stub_upstream, db_url, auth=True, env=env)
    as_admin = {"authorization": f"Bearer {chosen}"}
    keys = httpx.get(f"{proxy.v1}/admin/keys", headers=as_admin, timeout=5)
    assert keys.status_code == 200, keys.text
    assert [(k["project"], k["role"]) for k in keys.json()["data"]] == [("default", "admin")]
    assert chosen not in _dump_database(db_url) and chosen not in proxy.log.read_text()
    proxy.stop()
    again = start_proxy(stub_upstream, db_url, auth=True, env=env)  # a restart adds no second key
    assert len(httpx.get(f"{again.v1}/admin/keys", headers=as_admin, timeout=5).json()["data"]) == 1
    again.stop()
    with pytest.raises(RuntimeError, match="ONTHEJOB_ADMIN_KEY must be at least 24 characters"):
        start_proxy(stub_upstream, db_url, auth=True, env={"ONTHEJOB_ADMIN_KEY": "short"})
