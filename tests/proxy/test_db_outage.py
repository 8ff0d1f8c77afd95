"""Database stopped mid-run, auth on: calls keep succeeding, every record lands once it returns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.launcher import Engine
from storage.db import sync_engine
from storage.migrate import upgrade
from storage.models import Completion
from tests.pg_cluster import PgCluster
from tests.proxy.conftest import ProxyFactory, make_key

pytestmark = pytest.mark.engine


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    pg = PgCluster()
    pg.start()
    yield pg
    pg.destroy()


def test_calls_survive_a_database_outage(start_proxy: ProxyFactory, tiny_engine: Engine, cluster: PgCluster) -> None:
    upgrade(cluster.url)
    key, admin = make_key(cluster.url), make_key(cluster.url, role="admin")
    proxy = start_proxy(tiny_engine.url, cluster.url, auth=True)
    as_admin = {"authorization": f"Bearer {admin}"}  # /metrics is the operator's (ONTHEJOB_METRICS_ACCESS)
    assert httpx.get(f"{proxy.url}/metrics", headers=as_admin, timeout=10).status_code == 200
    client = openai.OpenAI(base_url=proxy.v1, api_key=key, max_retries=0)
    model = tiny_engine.model.name
    ids: list[str] = []

    def call(i: int, stream: bool = False) -> None:
        messages = [{"role": "user", "content": f"call {i}"}]
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=messages, max_tokens=3, stream=True
            ) as resp:  # type: ignore[arg-type]
                ids.append(resp.headers["x-request-id"])
                assert list(resp.parse())
        else:
            raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=3)  # type: ignore[arg-type]
            ids.append(raw.headers["x-request-id"])

    for i in range(5):
        call(i, stream=i % 2 == 1)
    cluster.stop()
    for i in range(5, 15):
        call(i, stream=i % 2 == 1)  # the key was verified before: it keeps working from the cache
    ready = httpx.get(f"{proxy.url}/readyz", timeout=10).json()
    assert ready["database"] == "down" and ready["spool"]["depth"] > 0 and ready["status"] == "degraded"
    metrics = httpx.get(f"{proxy.url}/metrics", headers=as_admin, timeout=10).text  # verified before: cached
    assert "onthejob_db_up 0.0" in metrics
    # An unknown key cannot be verified now: 503, never a false 401.
    other = httpx.post(
        f"{proxy.v1}/chat/completions",
        headers={"authorization": "Bearer otj-unknown"},
        json={"model": model, "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    assert other.status_code == 503
    cluster.start()
    proxy.wait_drained(timeout=60)
    eng = sync_engine(cluster.url)
    with Session(eng) as db:
        rows = list(db.scalars(select(Completion.id).where(Completion.id.in_(ids))))
    eng.dispose()
    counts = Counter(rows)
    assert set(counts) == set(ids) and len(ids) == 15
    assert max(counts.values()) == 1
    assert "onthejob_records_dropped_total" not in metrics or 'onthejob_records_dropped_total{reason="' not in metrics
