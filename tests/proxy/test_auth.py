"""The key cache stays bounded whatever is presented; failed authentications slow down per client address.

Auth against the real (migrated) Postgres, no HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from proxy import auth as auth_module
from proxy.auth import Auth
from proxy.errors import RateLimited, Unauthorized
from storage.db import async_engine, sync_engine
from storage.keys import create_key

pytestmark = pytest.mark.anyio


@pytest.fixture
async def keyed(pg_factory: Any) -> AsyncIterator[tuple[Auth, str]]:
    db_url = pg_factory()
    eng = sync_engine(db_url)
    with Session(eng) as db:
        secret = create_key(db, "default", "harness").secret
        db.commit()
    eng.dispose()
    aeng = async_engine(db_url, poolclass=NullPool)
    yield Auth(async_sessionmaker(aeng), enabled=True, default_project="default", ttl_s=60.0), secret
    await aeng.dispose()


async def test_the_key_cache_is_a_bounded_lru(keyed: tuple[Auth, str]) -> None:
    auth, secret = keyed
    auth.max_entries = 50
    for i in range(300):
        if i % 10 == 0:
            await auth.authenticate(f"Bearer {secret}", client="10.0.0.1")  # used often: stays cached
        with pytest.raises(Unauthorized):
            await auth.authenticate(f"Bearer otj-garbage-{i}", client=f"10.1.{i // 250}.{i % 250}")
    assert len(auth._cache) <= 50
    found = []

    async def no_database(digest: str) -> Any:
        found.append(digest)
        raise AssertionError("a recently used valid key was evicted")

    auth._lookup = no_database  # type: ignore[method-assign]
    assert (await auth.authenticate(f"Bearer {secret}", client="10.0.0.1")).project_id == "default"
    assert found == []


async def test_repeated_failures_from_one_address_are_slowed_down(keyed: tuple[Auth, str]) -> None:
    auth, secret = keyed
    await auth.authenticate(f"Bearer {secret}", client="203.0.113.7")  # a real user behind the same address
    for i in range(auth_module.FAILURE_BURST):
        with pytest.raises(Unauthorized):
            await auth.authenticate(f"Bearer otj-guess-{i}", client="203.0.113.7")
    lookups = []
    real_lookup = auth._lookup

    async def counted(digest: str) -> Any:
        lookups.append(digest)
        return await real_lookup(digest)

    auth._lookup = counted  # type: ignore[method-assign]
    for i in range(5):
        with pytest.raises(RateLimited) as info:
            await auth.authenticate(f"Bearer otj-more-{i}", client="203.0.113.7")
        assert info.value.status == 429 and int(info.value.headers["retry-after"]) >= 1
    assert lookups == []  # refused before any database work
    assert (
        await auth.authenticate(f"Bearer {secret}", client="203.0.113.7")
    ).project_id == "default"  # verified: passes
    with pytest.raises(Unauthorized):
        await auth.authenticate("Bearer otj-guess-x", client="198.51.100.1")  # another address: its own budget
