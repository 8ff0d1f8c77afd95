"""Per-key rate limits: a token bucket per API key, answered with OpenAI-style headers."""

from __future__ import annotations

import math
import time

from proxy.errors import RateLimited


class RateLimiter:
    """``rate`` requests per second sustained, ``burst`` at once; 0 disables it."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, last refill)

    def check(self, key_id: str | None) -> None:
        if self.rate <= 0 or key_id is None:
            return
        now = time.monotonic()
        tokens, last = self._buckets.get(key_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens < 1.0:
            wait = (1.0 - tokens) / self.rate
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
