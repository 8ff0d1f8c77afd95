"""The one upstream HTTP client (proxy/http_client.py), behind a small API.

Which replica serves a call is chosen by proxy/replicas.py; this client only talks to the one it is given.
Timeouts: connect, and idle between reads; never a total timeout on a stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.http_client import HttpClient, UpstreamConnectError, UpstreamIdleTimeout, UpstreamResponse

__all__ = [
    "UPSTREAM_FAILURES",
    "Upstream",
    "UpstreamConnectError",
    "UpstreamIdleTimeout",
    "UpstreamResponse",
    "sse_batches",
]

# What a broken, refused or reset engine connection raises: every error of proxy/http_client.py is an
# OSError, its idle timeout too (TimeoutError is one: catch that first where it means something else).
UPSTREAM_FAILURES = (OSError,)


class Upstream:
    def __init__(self, urls: list[str], connect_timeout: float, idle_timeout: float) -> None:
        self.urls = urls
        self._client = HttpClient(connect_timeout, idle_timeout)
        self.fingerprints: dict[str, str] = {}  # per replica: vLLM's system_fingerprint, seen in replies

    async def close(self) -> None:
        await self._client.close()

    async def open(self, base: str, path: str, body: bytes) -> UpstreamResponse:
        """POST a JSON body and return the response with its body unread (the caller streams it)."""
        return await self._client.request("POST", base, path, body)

    async def get_json(self, base: str, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        async with asyncio.timeout(timeout):
            resp = await self._client.request("GET", base, path, idle_timeout=timeout)
            raw = await resp.read()
        return resp.status, _maybe_json(raw)

    async def post_json(self, base: str, path: str, payload: Any, timeout: float = 120.0) -> tuple[int, Any]:
        async with asyncio.timeout(timeout):
            resp = await self._client.request("POST", base, path, orjson.dumps(payload), idle_timeout=timeout)
            raw = await resp.read()
        return resp.status, _maybe_json(raw)


def _maybe_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


async def sse_batches(resp: UpstreamResponse) -> AsyncIterator[list[bytes]]:
    """For each network read, the payloads of the ``data:`` lines it completed (no coalescing in time)."""
    buffer = b""
    async for chunk in resp.chunks():
        buffer += chunk
        lines = buffer.split(b"\n")
        buffer = lines.pop()
        batch = [line.rstrip(b"\r")[5:].strip() for line in lines if line.startswith(b"data:")]
        if batch:
            yield batch
    if buffer.strip().startswith(b"data:"):
        yield [buffer.strip()[5:].strip()]
