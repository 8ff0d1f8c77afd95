"""API key authentication with a cache that outlives database outages.

Keys are looked up by their sha256 and compared in constant time. A key seen
valid keeps working while the database is down (the LiteLLM failure where valid
keys got 401 during an outage); an unseen key during an outage gets 503, never a
false 401. A key comes as ``Authorization: Bearer <key>`` (OpenAI clients) or as
``x-api-key: <key>`` (Anthropic clients); Bearer wins when both are sent. A dialect may take its
own (Gemini's ``x-goog-api-key`` or ``?key=``, proxy/dialects/gemini.py), passed on here as Bearer.

Both memories are bounded. The key cache is an LRU of ``max_entries`` digests: every
presented token (garbage too) is a lookup and an entry, so an unbounded dict grew with
whatever a scanner sent. Failed authentications are counted per client address in a
token bucket (``FAILURE_BURST`` free, then one per ``FAILURE_REFILL_S``): past that, an
address gets 429 for keys not already verified, without a database lookup, while keys
it used successfully keep working (a NAT shared with a scanner does not lock people out).
"""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.errors import RateLimited, Unauthorized, Unavailable
from proxy.ratelimit import RateLimiter
from storage.keys import hash_key
from storage.models import ApiKey

NEGATIVE_TTL_S = 5.0
MAX_ENTRIES = 10_000  # cached key digests (valid and invalid), least recently used evicted first
MAX_ADDRESSES = 10_000  # client addresses with recent failures, least recently failed evicted first
FAILURE_BURST = 10  # failed authentications an address may make at once ...
FAILURE_REFILL_S = 1.0  # ... then one per this many seconds


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller, resolved from its API key (or the default project under --no-auth)."""

    project_id: str
    role: str  # "harness" | "admin"
    key_id: str | None


class Auth:
    """Who is calling, and whether its key may call now: the one admission check of every route."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        enabled: bool,
        default_project: str,
        ttl_s: float,
        ratelimiter: RateLimiter | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.enabled = enabled
        self.default_project = default_project
        self.ttl_s = ttl_s
        self.ratelimiter = ratelimiter or RateLimiter(0, 1)
        self.max_entries = MAX_ENTRIES
        self._cache: OrderedDict[str, tuple[Principal | None, float]] = OrderedDict()
        self.failures = FailureThrottle()

    async def admit(
        self, authorization: str | None, api_key: str | None = None, client: str | None = None
    ) -> Principal:
        """The caller of a request with these key headers (``client``: its address), within its key's rate limit.

        Both the FastAPI dependency (proxy/deps.py) and the call routes' fast path ask this.
        """
        principal = await self.authenticate(authorization, api_key, client=client)
        self.ratelimiter.check(principal.key_id)
        return principal

    async def authenticate(
        self, authorization: str | None, api_key: str | None = None, *, client: str | None = None
    ) -> Principal:
        """The caller of a key sent as ``Authorization: Bearer`` or ``x-api-key``; ``client``: its address."""
        if not self.enabled:
            return Principal(self.default_project, "admin", None)
        if authorization and authorization.lower().startswith("bearer "):
            secret = authorization[7:].strip()
        elif api_key and api_key.strip():
            secret = api_key.strip()
        else:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer <key>', 'x-api-key: <key>'"
                " or (Gemini) 'x-goog-api-key: <key>' (create one with `onthejob keys create`)"
            )
        digest = hash_key(secret)
        cached = self._cache.get(digest)
        now = time.monotonic()
        verified = cached is not None and cached[0] is not None  # seen valid: never throttled
        if cached is not None:
            self._cache.move_to_end(digest)
            if cached[1] > now and verified:
                return _or_401(cached[0])
        if client is not None and not verified:
            self.failures.check(client, now)
        if cached is not None and cached[1] > now:  # known invalid, recently
            self.failures.failed(client, now)
            return _or_401(None)
        try:
            principal = await self._lookup(digest)
        except (SQLAlchemyError, OSError) as exc:
            if cached is not None and cached[0] is not None:
                return cached[0]  # database down: trust what we verified before
            raise Unavailable("cannot verify the API key while the database is unreachable; retry shortly") from exc
        self._cache[digest] = (principal, now + (self.ttl_s if principal else NEGATIVE_TTL_S))
        self._cache.move_to_end(digest)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        if principal is None:
            self.failures.failed(client, now)
        return _or_401(principal)

    async def _lookup(self, digest: str) -> Principal | None:
        async with self.sessionmaker() as db:
            row = await db.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
        if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
            return None
        return Principal(row.project_id, row.role, row.id)

    def forget(self) -> None:
        """Drop cached keys (after a revocation)."""
        self._cache.clear()


class FailureThrottle:
    """Per client address: ``FAILURE_BURST`` failed authentications, then one per ``FAILURE_REFILL_S``."""

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, last refill)

    def _tokens(self, client: str, now: float) -> float:
        tokens, last = self._buckets.get(client, (float(FAILURE_BURST), now))
        return min(float(FAILURE_BURST), tokens + (now - last) / FAILURE_REFILL_S)

    def check(self, client: str, now: float) -> None:
        """429 when ``client`` has used up its failures; nothing is looked up for it meanwhile."""
        if client not in self._buckets:
            return
        tokens = self._tokens(client, now)
        if tokens < 1.0:
            wait = (1.0 - tokens) * FAILURE_REFILL_S
            raise RateLimited(
                f"too many failed authentications from this address; retry in {wait:.1f}s with a valid key",
                code="too_many_failed_authentications",
                headers={"retry-after": str(max(1, math.ceil(wait)))},
            )

    def failed(self, client: str | None, now: float) -> None:
        if client is None:
            return
        self._buckets[client] = (self._tokens(client, now) - 1.0, now)
        self._buckets.move_to_end(client)
        while len(self._buckets) > MAX_ADDRESSES:
            self._buckets.popitem(last=False)


def _or_401(principal: Principal | None) -> Principal:
    if principal is None:
        raise Unauthorized(
            "invalid API key: check the key, or create one with `onthejob keys create`", code="invalid_api_key"
        )
    return principal
