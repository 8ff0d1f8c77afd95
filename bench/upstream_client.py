"""The upstream client alone: aiohttp's against the proxy's own (proxy/http_client.py), CPU a call.

One process on core 1 sends ``--calls`` non-streamed chat calls at ``--concurrency`` to the stub
engine (core 0) with each client in turn (rounds alternate which goes first) and reads each reply
whole, as the proxy does: this process's CPU per call (``time.process_time``) and its req/s,
medians over the rounds, and their ratio.

Run: ``python -m bench.upstream_client [--rounds 4] [--calls 20000] [--concurrency 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import uvloop

from bench import peers
from bench.harness import pin_self, rotated
from proxy.http_client import HttpClient

BODY = orjson.dumps(
    {
        "model": peers.MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "return_token_ids": True,
        "logprobs": True,
    }
)
PATH = "/v1/chat/completions"
Call = Callable[[], Awaitable[bytes]]


async def with_aiohttp(base: str, calls: int, concurrency: int) -> tuple[float, float]:
    # The settings proxy/upstream.py had: no total timeout, unlimited pool, read timeout between reads.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def call() -> bytes:
            resp = await session.post(f"{base}{PATH}", data=BODY, headers={"content-type": "application/json"})
            return await resp.read()

        return await drive(call, calls, concurrency)


async def with_ours(base: str, calls: int, concurrency: int) -> tuple[float, float]:
    client = HttpClient(connect_timeout=10, idle_timeout=300)

    async def call() -> bytes:
        return await (await client.request("POST", base, PATH, BODY)).read()

    try:
        return await drive(call, calls, concurrency)
    finally:
        await client.close()


async def drive(call: Call, calls: int, concurrency: int) -> tuple[float, float]:
    """(µs of this process's CPU a call, calls a second)."""
    for _ in range(concurrency):  # warm: one connection per worker
        assert (await call()).startswith(b"{")
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            assert (await call()).startswith(b"{")

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / calls * 1e6, calls / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    clients = {"aiohttp": with_aiohttp, "ours": with_ours}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    stub = peers.stub(Path(tempfile.mkdtemp(prefix="onthejob-client-")), {0})
    pin_self({1})
    try:
        for i in range(args.rounds):
            for name in rotated(list(clients), i):
                got = uvloop.run(clients[name](stub.url, args.calls, args.concurrency))
                results[name].append(got)
                print(f"  round {i + 1} {name:8s} {got[0]:6.1f} µs CPU a call  {got[1]:8,.0f} calls/s", flush=True)
    finally:
        stub.stop()
    med = {
        name: (statistics.median(c for c, _ in got), statistics.median(s for _, s in got))
        for name, got in results.items()
    }
    print(f"\nmedians of {args.rounds} rounds, c={args.concurrency}, {args.calls:,} calls each, stub engine on core 0:")
    for name, (cpu, rps) in med.items():
        print(f"  {name:8s} {cpu:6.1f} µs CPU a call  {rps:8,.0f} calls/s")
    (a_cpu, a_rps), (o_cpu, o_rps) = med["aiohttp"], med["ours"]
    print(f"  ours / aiohttp: CPU a call {o_cpu / a_cpu:.2f}x, calls/s {o_rps / a_rps:.2f}x")


if __name__ == "__main__":
    main()
