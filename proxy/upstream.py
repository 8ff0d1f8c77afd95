"""The one upstream HTTP client (aiohttp: measured ~13x httpx's throughput here), behind a small API.

Which replica serves a call is chosen by proxy/replicas.py; this client only talks to the one it is given.
Timeouts: connect, and idle between reads; never a total timeout on a stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

JSON_HEADERS = CIMultiDict({"content-type": "application/json"})
# What a broken, refused or reset engine connection raises.
UPSTREAM_FAILURES = (aiohttp.ClientError, ConnectionError, OSError)


class Upstream:
    def __init__(self, urls: list[str], connect_timeout: float, idle_timeout: float) -> None:
        self.urls = urls
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=idle_timeout)
        self._session: aiohttp.ClientSession | None = None
        self.fingerprints: dict[str, str] = {}  # per replica: vLLM's system_fingerprint, seen in replies
        self._urls: dict[tuple[str, str], URL] = {}  # per (replica, route), parsed once

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            json_serialize=lambda o: orjson.dumps(o).decode(),
            auto_decompress=True,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    async def open(self, base: str, path: str, body: bytes) -> aiohttp.ClientResponse:
        """POST a JSON body and return the response with its body unread (the caller streams it)."""
        url = self._urls.get((base, path))
        if url is None:  # parsed once per replica and route, not per call
            url = self._urls[(base, path)] = URL(f"{base}{path}")
        return await self.session.post(url, data=body, headers=JSON_HEADERS)

    async def get_json(self, base: str, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        async with self.session.get(f"{base}{path}", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            raw = await resp.read()
            return resp.status, _maybe_json(raw)

    async def post_json(self, base: str, path: str, payload: Any, timeout: float = 120.0) -> tuple[int, Any]:
        async with self.session.post(
            f"{base}{path}",
            data=orjson.dumps(payload),
            headers={"content-type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            return resp.status, _maybe_json(raw)


def _maybe_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


async def sse_batches(resp: aiohttp.ClientResponse) -> AsyncIterator[list[bytes]]:
    """For each network read, the payloads of the ``data:`` lines it completed (no coalescing in time)."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        lines = buffer.split(b"\n")
        buffer = lines.pop()
        batch = [line.rstrip(b"\r")[5:].strip() for line in lines if line.startswith(b"data:")]
        if batch:
            yield batch
    if buffer.strip().startswith(b"data:"):
        yield [buffer.strip()[5:].strip()]
