"""API key authentication with a cache that outlives database outages.

Keys are looked up by their sha256 and compared in constant time. A key seen
valid keeps working while the database is down (the LiteLLM failure where valid
keys got 401 during an outage); an unseen key during an outage gets 503, never a
false 401. A key comes as ``Authorization: Bearer <key>`` (OpenAI clients) or as
``x-api-key: <key>`` (Anthropic clients); Bearer wins when both are sent.
"""

from __future__ import annotations

import hmac
import time

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.deps import Principal
from proxy.errors import Unauthorized, Unavailable
from storage.keys import hash_key
from storage.models import ApiKey

NEGATIVE_TTL_S = 5.0


class Auth:
    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], *, enabled: bool, default_project: str, ttl_s: float
    ) -> None:
        self.sessionmaker = sessionmaker
        self.enabled = enabled
        self.default_project = default_project
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[Principal | None, float]] = {}

    async def authenticate(self, authorization: str | None, api_key: str | None = None) -> Principal:
        """The caller of a key sent as ``Authorization: Bearer`` or ``x-api-key``."""
        if not self.enabled:
            return Principal(self.default_project, "admin", None)
        if authorization and authorization.lower().startswith("bearer "):
            secret = authorization[7:].strip()
        elif api_key and api_key.strip():
            secret = api_key.strip()
        else:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                " (create one with `onthejob keys create`)"
            )
        digest = hash_key(secret)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and cached[1] > now:
            return _or_401(cached[0])
        try:
            principal = await self._lookup(digest)
        except (SQLAlchemyError, OSError) as exc:
            if cached is not None and cached[0] is not None:
                return cached[0]  # database down: trust what we verified before
            raise Unavailable("cannot verify the API key while the database is unreachable; retry shortly") from exc
        self._cache[digest] = (principal, now + (self.ttl_s if principal else NEGATIVE_TTL_S))
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


def _or_401(principal: Principal | None) -> Principal:
    if principal is None:
        raise Unauthorized(
            "invalid API key: check the key, or create one with `onthejob keys create`", code="invalid_api_key"
        )
    return principal
