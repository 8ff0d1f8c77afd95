"""/readyz without the operator's key shows states and counts only; passwords never printed with a URL.

The real app and lifespan in one process (auth on), Postgres and the stub engine. Before, anyone
saw every loaded adapter as ``project~alias@vN`` (other tenants' names) and raw ``last_error`` text.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from proxy.app import create_app
from proxy.settings import Settings
from tests.conftest import free_port
from tests.proxy.conftest import ProxyFactory, make_key

pytestmark = pytest.mark.anyio
ADAPTER, ERROR = "acme~support@v3", "HTTP 500 from http://10.0.0.7:8000 while loading acme~support@v3"


async def test_readyz_without_the_operators_key_shows_counts(
    tmp_path: Path, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    operator, tenant_admin = make_key(db_url, "default", "admin"), make_key(db_url, "acme", "admin")
    settings = Settings(
        upstreams=[stub_upstream],
        database_url=db_url,
        spool_dir=tmp_path / "spool",
        auth=True,
        reconcile_every_s=3600.0,
        alias_refresh_s=3600.0,
        probe_every_s=3600.0,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        replica = app.state.onthejob.router.replicas.replicas[0]
        replica.models = {*replica.models, ADAPTER}
        replica.last_error = ERROR
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            shown = {}
            for who, key in (
                ("anyone", None),
                ("bad key", "otj-nope"),
                ("a tenant's admin", tenant_admin),
                ("operator", operator),
            ):
                resp = await client.get("/readyz", headers={"authorization": f"Bearer {key}"} if key else {})
                assert resp.status_code == 200 and resp.json()["status"] == "ready", (who, resp.text)
                shown[who] = resp.json()
    for who in ("anyone", "bad key", "a tenant's admin"):
        body = shown[who]
        assert ADAPTER not in str(body) and "10.0.0.7" not in str(body) and stub_upstream not in str(body), who
        assert body["upstream"] == {"up": 1, "down": 0}
        (counts,) = body["replicas"]
        assert counts["state"] == "up" and counts["adapters"] >= 1 and counts["errored"] is True
        assert body["spool"]["depth"] == 0 and body["database"] == "up"  # what load balancers and scripts read
    detail = shown["operator"]["replicas"][stub_upstream]
    assert ADAPTER in detail["adapters"] and detail["last_error"] == ERROR


def test_db_upgrade_prints_no_password(pg_factory: Any) -> None:
    """Before: ``onthejob db upgrade`` printed DATABASE_URL as given, password included (compose runs it)."""
    url = make_url(pg_factory(migrate=False)).set(password="hunter2-secret").render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-m", "onthejob.cli", "db", "upgrade", "--db", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "hunter2-secret" not in done.stdout + done.stderr and "***" in done.stdout, done.stdout


def test_serve_logs_no_password(start_proxy: ProxyFactory, stub_upstream: str) -> None:
    dead = f"postgresql://postgres:hunter2-secret@127.0.0.1:{free_port()}/gone"
    proxy = start_proxy(stub_upstream, dead)
    assert httpx.get(f"{proxy.v1}/chat/completions/cmpl-x", timeout=30).status_code == 503
    proxy.stop()
    assert "hunter2-secret" not in proxy.log.read_text(errors="replace")
