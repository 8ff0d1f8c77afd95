"""Rate limits across hosts: the share arithmetic, the fallback, and leases renewed through the database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from proxy.errors import RateLimited
from proxy.ratelimit import LeaseKeeper, RateLimiter, fair_shares, fallback_share
from storage.db import async_engine, sync_engine
from storage.migrate import upgrade
from storage.rate_leases import PRESENCE, renew
from tests.conftest import free_port

pytestmark = pytest.mark.anyio
LATER = 1e12  # a monotonic time past any lease


def test_shares_are_max_min_fair_and_sum_to_the_limit() -> None:
    assert fair_shares(50.0, {"a": 50.0, "b": 50.0}) == {"a": 25.0, "b": 25.0}  # 2x, split 50/50
    assert fair_shares(50.0, {"a": 90.0, "b": 10.0}) == {"a": 40.0, "b": 10.0}  # 2x, 90/10: b gets all it asks
    assert fair_shares(30.0, {"a": 5.0, "b": 100.0, "c": 40.0}) == {"a": 5.0, "b": 12.5, "c": 12.5}
    assert fair_shares(30.0, {"a": 5.0, "b": 15.0, "c": 40.0}) == {"a": 5.0, "b": 12.5, "c": 12.5}
    assert fair_shares(30.0, {"a": 5.0, "b": 10.0, "c": 40.0}) == {"a": 5.0, "b": 10.0, "c": 15.0}
    # Under the limit: what each asks plus an even part of the spare (growth is admitted at once).
    assert fair_shares(50.0, {"a": 10.0, "b": 20.0}) == {"a": 20.0, "b": 30.0}
    assert fair_shares(50.0, {"a": 0.0}) == {"a": 50.0}
    assert fair_shares(50.0, {}) == {}


def test_the_fallback_is_the_limit_over_hosts_split_among_the_hosts_workers() -> None:
    assert fallback_share(60.0, 2, 1) == 30.0
    assert fallback_share(60.0, 2, 3) == 10.0
    assert fallback_share(60.0, 0, 0) == 60.0  # nothing known: this host and worker alone


def test_a_limiter_admits_its_lease_while_valid_then_the_fallback() -> None:
    limiter = RateLimiter(rate=40.0, burst=8)
    limiter.on_new_key = lambda: None  # as a LeaseKeeper sets it: the limiter counts calls per key
    assert limiter.share("k") == 40.0  # alone: the whole limit
    limiter.lease({"k": 30.0}, fallback=20.0, valid_for_s=60.0)
    assert (limiter.share("k"), limiter.share("other")) == (30.0, 20.0)
    assert limiter.share("k", now=LATER) == 20.0  # the lease ran out without renewal
    limiter.lease({"k": 4.0}, fallback=20.0, valid_for_s=60.0)
    admitted = 0
    for _ in range(10):  # the bucket holds the share's part of the burst: 8 * 4/40 rounds up to one call
        try:
            limiter.check("k")
            admitted += 1
        except RateLimited:
            pass
    assert admitted == 1
    assert limiter.take_asked() == {"k": 10} and limiter.take_asked() == {}


def _keeper(maker: async_sessionmaker[AsyncSession], host: str, rate: float = 20.0) -> LeaseKeeper:
    return LeaseKeeper(RateLimiter(rate, 20), maker, host, "1", every_s=1.0, ttl_s=30.0)


def _ask(keeper: LeaseKeeper, key: str, calls: int) -> None:
    for _ in range(calls):
        try:
            keeper.limiter.check(key)
        except RateLimited:
            pass


@pytest.fixture
async def maker(pg_factory: object) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = async_engine(pg_factory())  # type: ignore[operator]
    yield async_sessionmaker(engine, expire_on_commit=False)
    await engine.dispose()


async def test_two_hosts_lease_shares_of_one_key_by_their_demand(maker: async_sessionmaker[AsyncSession]) -> None:
    a, b = _keeper(maker, "host-a"), _keeper(maker, "host-b")
    assert await a.renew_once() and await b.renew_once()  # presence: both now know of two hosts
    _ask(a, "key-1", 30)  # within one renewal period: 30 and 5 requests/s
    _ask(b, "key-1", 5)
    assert await a.renew_once() and await b.renew_once() and await a.renew_once()
    # a's demand decays (no calls since), b's row is as b wrote it: both see the same pair of rows.
    assert b.limiter.share("key-1") == pytest.approx(5.0)
    assert a.limiter.share("key-1") == pytest.approx(15.0)
    assert (a.hosts, a.workers, b.hosts) == (2, 1, 2)
    assert a.limiter.fallback == 10.0  # new keys, and every key once leases lapse: 20 / 2 hosts


async def test_with_the_database_down_each_host_falls_back_to_limit_over_hosts(
    maker: async_sessionmaker[AsyncSession],
) -> None:
    a, b = _keeper(maker, "host-a"), _keeper(maker, "host-b")
    _ask(a, "key-1", 40)
    assert await b.renew_once() and await a.renew_once()
    assert a.limiter.share("key-1") == pytest.approx(20.0)  # the only holder of the key
    dead = async_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    a.sessionmaker = async_sessionmaker(dead, expire_on_commit=False)
    _ask(a, "key-1", 40)
    assert not await a.renew_once()
    assert a.limiter.share("key-1") == pytest.approx(20.0)  # the lease still runs
    assert a.limiter.share("key-1", now=LATER) == pytest.approx(10.0)  # then the last known 2 hosts split it
    await dead.dispose()


def test_renewal_reads_live_holders_on_sqlite_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    upgrade(url)
    engine = sync_engine(url)
    with Session(engine) as db:
        renew(db, "host-a", "1", {"key-1": 3.0}, ttl_s=5.0)
        renew(db, "host-a", "1", {"key-1": 4.0}, ttl_s=5.0)  # an upsert, not a second row
        leases = renew(db, "host-b", "7", {"key-1": 1.5}, ttl_s=5.0)
    got = sorted((lease.key_id, lease.host_id, lease.worker, lease.demand) for lease in leases)
    assert got == [
        (PRESENCE, "host-a", "1", 0.0),
        (PRESENCE, "host-b", "7", 0.0),
        ("key-1", "host-a", "1", 4.0),
        ("key-1", "host-b", "7", 1.5),
    ]
    engine.dispose()
