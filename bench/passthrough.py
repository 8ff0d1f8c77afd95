"""The bare pass-through the proxy is measured against: Starlette + one aiohttp client, nothing recorded.

It does what any proxy must (read the body, POST it upstream, relay status, the
content type and the body, streaming chunk by chunk) and nothing else, so the
difference between it and onthejob is the cost of capture and recording.
``--client ours`` swaps aiohttp for the proxy's own upstream client (proxy/http_client.py):
the reference with the same client as onthejob, for the ratio that leaves the client out.

Run: ``python -m bench.passthrough --upstream http://127.0.0.1:9000 --port 9100 [--client ours]``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str, client: str = "aiohttp") -> Starlette:
    """A pass-through to ``upstream`` for the two OpenAI call routes."""
    base = upstream.rstrip("/").removesuffix("/v1")
    if client == "ours":
        return _with_our_client(base)
    holder: dict[str, aiohttp.ClientSession] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # Same client settings as proxy/upstream.py: no total timeout, unlimited pool.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=300)
        holder["session"] = aiohttp.ClientSession(connector=connector, timeout=timeout)
        yield
        await holder["session"].close()

    async def forward(request: Request) -> Response:
        body = await request.body()
        resp = await holder["session"].post(
            f"{base}{request.url.path}", data=body, headers={"content-type": "application/json"}
        )
        ctype = resp.headers.get("content-type", "application/json")
        if ctype.startswith("text/event-stream"):

            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for chunk in resp.content.iter_any():
                        yield chunk
                finally:
                    resp.release()

            return StreamingResponse(chunks(), status_code=resp.status, media_type=ctype)
        raw = await resp.read()
        resp.release()
        return Response(raw, status_code=resp.status, media_type=ctype)

    routes = [Route(p, forward, methods=["POST"]) for p in ("/v1/chat/completions", "/v1/completions")]
    return Starlette(routes=routes, lifespan=lifespan)


def _with_our_client(base: str) -> Starlette:
    """The same pass-through on proxy/http_client.py (the timeouts of proxy/upstream.py's defaults)."""
    from proxy.http_client import HttpClient

    client = HttpClient(connect_timeout=10, idle_timeout=300)

    async def forward(request: Request) -> Response:
        resp = await client.request("POST", base, request.url.path, await request.body())
        ctype = resp.headers.get("content-type", "application/json")
        if ctype.startswith("text/event-stream"):

            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for chunk in resp.chunks():
                        yield chunk
                finally:
                    resp.release()

            return StreamingResponse(chunks(), status_code=resp.status, media_type=ctype)
        return Response(await resp.read(), status_code=resp.status, media_type=ctype)

    routes = [Route(p, forward, methods=["POST"]) for p in ("/v1/chat/completions", "/v1/completions")]
    return Starlette(routes=routes)


def app_from_env() -> Starlette:
    """The app for each worker process when ``--workers`` > 1."""
    return create_app(os.environ["PASSTHROUGH_UPSTREAM"], os.environ.get("PASSTHROUGH_CLIENT", "aiohttp"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--client", choices=("aiohttp", "ours"), default="aiohttp", help="the upstream client")
    args = parser.parse_args()
    server = {
        "host": "127.0.0.1",
        "port": args.port,
        "loop": "uvloop",
        "http": "httptools",
        "log_level": "warning",
        "access_log": False,
    }
    if args.workers > 1:
        os.environ["PASSTHROUGH_UPSTREAM"], os.environ["PASSTHROUGH_CLIENT"] = args.upstream, args.client
        uvicorn.run("bench.passthrough:app_from_env", factory=True, workers=args.workers, **server)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(args.upstream, args.client), **server)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
