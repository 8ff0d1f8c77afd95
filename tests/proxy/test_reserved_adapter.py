"""A version a publish has reserved but not committed (trainer/publish.py) is never deployed: its row
exists before its weights do, so the deploy route treats it as unknown until the publish commits."""

from __future__ import annotations

import httpx
from sqlalchemy import update
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.models import Adapter
from storage.models.training import ADAPTER_COMMITTED, ADAPTER_RESERVED
from tests.proxy.conftest import ProxyFactory, add_adapter, make_key


def test_a_reserved_version_is_not_deployed_until_committed(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: object, tmp_path: object
) -> None:
    db_url = pg_factory()  # type: ignore[operator]
    admin = {"authorization": f"Bearer {make_key(db_url, 'proj', 'admin')}"}
    proxy = start_proxy(stub_upstream, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    made = httpx.post(
        f"{proxy.v1}/admin/aliases", headers=admin, timeout=10, json={"name": "helper", "base_model": "stub-model"}
    )
    assert made.status_code == 201, made.text
    add_adapter(db_url, "proj", "helper", 1, f"{tmp_path}/helper/v1", "stub-model", state=ADAPTER_RESERVED)
    eng = sync_engine(db_url)
    reserved = httpx.post(
        f"{proxy.v1}/admin/deployments", headers=admin, timeout=30, json={"alias": "helper", "version": 1}
    )
    assert reserved.status_code == 404, reserved.text
    assert reserved.json()["error"]["message"]
    with Session(eng) as db:
        db.execute(update(Adapter).where(Adapter.alias == "helper").values(state=ADAPTER_COMMITTED))
        db.commit()
    committed = httpx.post(
        f"{proxy.v1}/admin/deployments", headers=admin, timeout=30, json={"alias": "helper", "version": 1}
    )
    assert committed.status_code != 404, committed.text
    eng.dispose()
