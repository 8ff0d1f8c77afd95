"""Redaction fails closed: a proxy that starts while its database is down redacts by the last known
policies (kept beside the spool), and refuses, rather than spooling unredacted, when it knows none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.conftest import free_port
from tests.proxy.conftest import ProxyFactory

SECRET = "sk-PLANTEDoutage0123456789"


def test_a_proxy_started_without_its_database_redacts_or_refuses(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    first = start_proxy(stub_upstream, pg_factory(), spool=spool)
    put = httpx.put(f"{first.v1}/admin/project", json={"redact": {"patterns": ["sk-[A-Za-z0-9]+"]}}, timeout=10)
    assert put.status_code == 200, put.text
    first.stop()

    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/gone"  # nothing listens there
    body = {"model": "stub-model", "messages": [{"role": "user", "content": f"my key is {SECRET}"}], "max_tokens": 2}
    second = start_proxy(stub_upstream, dead, spool=spool)
    served = httpx.post(f"{second.v1}/chat/completions", json=body, timeout=10)
    assert served.status_code == 200, served.text
    spooled = "".join(p.read_text(errors="replace") for p in spool.rglob("*.jsonl"))
    assert served.headers["x-request-id"] in spooled, "the call is recorded (in the spool while the database is down)"
    assert SECRET not in spooled and "my key is [redacted]" in spooled
    ready = httpx.get(f"{second.url}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    assert ready.json()["policies"] == "last_known"
    second.stop()

    (spool / "policies.json").unlink()  # no last known policy either
    third = start_proxy(stub_upstream, dead, spool=spool)
    refused = httpx.post(f"{third.v1}/chat/completions", json=body, timeout=10)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "redaction_policy_unknown"
    assert SECRET not in "".join(p.read_text(errors="replace") for p in spool.rglob("*.jsonl"))
    # It refuses every recorded call, so it must not look ready to a load balancer.
    ready = httpx.get(f"{third.url}/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
    assert ready.json()["policies"] == "none"
