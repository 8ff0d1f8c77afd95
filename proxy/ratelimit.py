"""Per-key rate limits across every proxy host: in-memory token buckets sized by leases in the database.

A key's limit (``rate`` requests/s, ``burst``) holds for all hosts on one database together. Every
``serve`` worker keeps a token bucket per key in memory, so a call never waits on the database, and a
background task (:class:`LeaseKeeper`) renews the worker's lease about every second: it writes how many
requests/s it was asked to admit for each key lately, reads the other holders' demands, and takes its
share of the key's limit by max-min fairness (:func:`fair_shares`): a holder asking for less than an even
split gets what it asks, the others split the rest, and while the key is under its limit the spare is
split evenly so growth is admitted at once. The holders are the workers (a row per key, host and worker),
so the workers of one host together hold the host's share, each in proportion to what it is asked.

A lease lasts ``ttl_s`` (3 s). When it cannot be renewed (the database down), each worker falls back
to ``rate / hosts / workers of its host``: the last host and worker counts it saw, from the presence
rows every worker writes whether or not it has traffic (before any: one host, ``Settings.workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.errors import RateLimited
from storage.rate_leases import PRESENCE, Lease, release, renew

log = logging.getLogger("onthejob.proxy")
H = TypeVar("H")

RENEW_EVERY_S = 1.0
LEASE_TTL_S = 3.0  # a share is used this long without renewal; then the fallback
IDLE_S = 10.0  # a key with no call for this long is no longer renewed (its row expires)
SMOOTHING = 0.5  # weight of the latest interval in a holder's demand (an exponential average)


def fair_shares(limit: float, demands: Mapping[H, float]) -> dict[H, float]:
    """Split ``limit`` among holders by their demands (requests/s), max-min fair; the shares sum to ``limit``.

    Under the limit each holder gets its demand plus an even part of the spare. Over it, the water
    level ``x`` with ``sum(min(demand, x)) == limit``: a holder asking less than ``x`` gets all it asks.
    """
    if not demands:
        return {}
    total = sum(max(0.0, d) for d in demands.values())
    if total <= limit:
        spare = (limit - total) / len(demands)
        return {h: max(0.0, d) + spare for h, d in demands.items()}
    shares: dict[H, float] = {}
    left, ordered = limit, sorted(demands.items(), key=lambda item: item[1])
    for i, (holder, demand) in enumerate(ordered):
        level = left / (len(ordered) - i)
        if demand > level:  # this one and every larger one get the level
            shares.update((h, level) for h, _ in ordered[i:])
            break
        shares[holder] = max(0.0, demand)
        left -= shares[holder]
    return shares


def fallback_share(limit: float, hosts: int, workers: int) -> float:
    """One worker's share with no lease: the host's ``limit / hosts``, split evenly among its workers."""
    return limit / max(1, hosts) / max(1, workers)


class RateLimiter:
    """``rate`` requests per second sustained, ``burst`` at once, per key; 0 disables it.

    Alone (no :class:`LeaseKeeper`), the whole limit is this process's. With one, each key's bucket
    fills at this worker's leased share (and holds the same fraction of ``burst``) while the lease is
    valid, else at the fallback share.
    """

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.fallback = rate  # requests/s a key gets here without a valid lease
        self.on_new_key: Callable[[], None] | None = None  # asks the keeper for a lease at once
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, last refill)
        self._shares: dict[str, float] = {}  # key id -> leased requests/s
        self._valid_until = 0.0  # monotonic time the leases in _shares expire
        self._asked: dict[str, int] = {}  # key id -> calls checked since the keeper last took them

    def share(self, key_id: str, now: float | None = None) -> float:
        """The requests/s this process admits for the key now."""
        if ((now if now is not None else time.monotonic()) < self._valid_until) and key_id in self._shares:
            return self._shares[key_id]
        return self.fallback

    def check(self, key_id: str | None) -> None:
        if self.rate <= 0 or key_id is None:
            return
        now = time.monotonic()
        if self.on_new_key is not None:  # a keeper measures demand from these counts (none: no leases)
            asked = self._asked.get(key_id)
            self._asked[key_id] = (asked or 0) + 1
            if asked is None and key_id not in self._shares:
                self.on_new_key()
        rate = self.share(key_id, now)
        burst = max(1.0, self.burst * rate / self.rate)
        tokens, last = self._buckets.get(key_id, (burst, now))
        tokens = min(burst, tokens + (now - last) * rate)
        if tokens < 1.0:
            wait = (1.0 - tokens) / rate if rate > 0 else 1.0
            self._buckets[key_id] = (tokens, now)
            raise RateLimited(
                f"rate limit reached for this key ({self.rate:g} requests/s, burst {self.burst}); retry in {wait:.2f}s",
                code="rate_limit_exceeded",
                headers={
                    "retry-after": str(max(1, math.ceil(wait))),
                    "x-ratelimit-limit-requests": str(self.burst),
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": f"{wait:.3f}s",
                },
            )
        self._buckets[key_id] = (tokens - 1.0, now)

    def take_asked(self) -> dict[str, int]:
        """The calls checked per key since the last take (the keeper's demand measure)."""
        asked, self._asked = self._asked, {}
        return asked

    def lease(self, shares: Mapping[str, float], fallback: float, valid_for_s: float) -> None:
        """Adopt renewed shares (every key not in ``shares`` gets ``fallback``) for ``valid_for_s``."""
        self._shares = dict(shares)
        self.fallback = fallback
        self._valid_until = time.monotonic() + valid_for_s


class LeaseKeeper:
    """Renews one worker's leases in the background and hands the limiter its shares."""

    def __init__(
        self,
        limiter: RateLimiter,
        sessionmaker: async_sessionmaker[AsyncSession],
        host_id: str,
        worker: str,
        *,
        workers: int = 1,
        every_s: float = RENEW_EVERY_S,
        ttl_s: float = LEASE_TTL_S,
    ) -> None:
        self.limiter, self.sessionmaker = limiter, sessionmaker
        self.host_id, self.worker = host_id, worker
        self.every_s, self.ttl_s = every_s, ttl_s
        self.hosts, self.workers = 1, max(1, workers)  # last known; before any renewal: this host alone
        self.demand: dict[str, float] = {}  # key id -> requests/s asked here lately (smoothed)
        self._last_asked: dict[str, float] = {}  # key id -> monotonic time of its last call here
        self._last_take = time.monotonic()
        self._wake = asyncio.Event()
        self._failing = False
        limiter.fallback = fallback_share(limiter.rate, self.hosts, self.workers)
        limiter.on_new_key = self._wake.set

    async def run(self) -> None:
        """Renew every ``every_s`` (at once when a new key calls) until cancelled; then release the rows."""
        try:
            while True:
                if await self.renew_once():
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can lose a cancellation that
                    # arrives as the wait ends, and this loop would then outlive the app's stop (a CI hang).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.every_s):
                            await self._wake.wait()
                else:  # the database down: no early retries for new keys, they take the fallback meanwhile
                    await asyncio.sleep(self.every_s)
                self._wake.clear()
        finally:
            with contextlib.suppress(Exception):
                async with self.sessionmaker() as db:
                    async with asyncio.timeout(2.0):
                        await db.run_sync(lambda s: release(s, self.host_id, self.worker))

    def measure(self, now: float) -> dict[str, float]:
        """This worker's smoothed demand per key (requests/s) from the calls since the last measure."""
        # At least one period: a renewal woken by a new key's first call a few ms later would read
        # that one call as hundreds a second.
        elapsed = max(self.every_s, now - self._last_take)
        self._last_take = now
        asked = self.limiter.take_asked()
        for key in asked:
            self._last_asked[key] = now
        for key in list(self._last_asked):
            if now - self._last_asked[key] > IDLE_S:
                del self._last_asked[key]
                self.demand.pop(key, None)
        for key in self._last_asked:
            latest = asked.get(key, 0) / elapsed
            before = self.demand.get(key)
            self.demand[key] = latest if before is None else SMOOTHING * latest + (1 - SMOOTHING) * before
        return dict(self.demand)

    async def renew_once(self) -> bool:
        """One renewal: write this worker's demands, read every live holder's, adopt the shares. False when
        the database did not answer (the current leases run out, then the fallback applies)."""
        demands = self.measure(time.monotonic())
        try:
            async with self.sessionmaker() as db:
                async with asyncio.timeout(self.ttl_s):
                    leases = await db.run_sync(lambda s: renew(s, self.host_id, self.worker, demands, self.ttl_s))
        except Exception as exc:  # noqa: BLE001 - the database down or slow: fall back when the lease ends
            if not self._failing:
                log.warning("rate-limit leases not renewed (%s); each host falls back to limit / hosts", exc)
            self._failing = True
            return False
        self._failing = False
        self.adopt(leases, demands)
        return True

    def adopt(self, leases: list[Lease], demands: Mapping[str, float]) -> None:
        """Shares from the live holders' rows (this worker's demands as just written)."""
        present = [lease for lease in leases if lease.key_id == PRESENCE]
        self.hosts = max(1, len({lease.host_id for lease in present}))
        self.workers = max(1, sum(1 for lease in present if lease.host_id == self.host_id))
        me = (self.host_id, self.worker)
        holders: dict[str, dict[tuple[str, str], float]] = {key: {me: demand} for key, demand in demands.items()}
        for lease in leases:
            if lease.key_id != PRESENCE and lease.key_id in holders:
                holders[lease.key_id].setdefault((lease.host_id, lease.worker), lease.demand)
        shares = {key: fair_shares(self.limiter.rate, wants)[me] for key, wants in holders.items()}
        self.limiter.lease(shares, fallback_share(self.limiter.rate, self.hosts, self.workers), self.ttl_s)
