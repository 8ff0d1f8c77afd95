"""Unnamed agent conversations through ``serve --workers N``: CPU a call, and whether every turn linked.

Each of ``--users`` simulated harnesses runs conversations of ``--turns`` turns without
naming a session: a system message, then user messages of ``--turn-chars`` each, every
reply appended as the assistant turn before the next user message, ``--think-ms``
between turns (a tool running, a person reading). The proxy has to find each turn's
parent by its messages: in its own memory when the same worker served the previous
turn, else in its sibling workers' spools, else in the database (once a turn is older
than the recorder's ~50 ms drain). Printed per server: calls/s, the server's CPU a call
(all its workers), Postgres' CPU a call, and the share of turns 2..N whose reply named
the session of their conversation's first turn (1.0: every turn linked).

Connections are kept alive and shared by the users (a pool, as an SDK's), so a conversation's
turns move between workers as the pool hands them out; ``--new-connections`` opens one per
call instead.

``--checkout PATH`` adds the same server run from another checkout (a ``git worktree`` of
another commit) in alternating rounds, and prints its figures as ratios.

Run: ``.venv/bin/python -m bench.conversations [--workers 2] [--turns 20] [--think-ms 100]
[--checkout PATH]`` (Postgres on 127.0.0.1:5432; the stub engine; nothing pinned).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import peers
from bench.harness import Server, rotated, throwaway_database, wait_spool_empty
from bench.recording_cpu import postgres_cpu


async def converse(
    url: str, users: int, turns: int, chars: int, think_s: float, seconds: float, new_connections: bool = False
) -> tuple[int, int, int, float]:
    """(calls, turns after the first, of those linked to their conversation's session, wall seconds)."""
    stop = time.monotonic() + seconds
    calls = later = linked = 0

    async def user(http: aiohttp.ClientSession, u: int) -> None:
        nonlocal calls, later, linked
        while time.monotonic() < stop:
            messages = [{"role": "system", "content": f"You are agent {u}."}]
            first = None
            for turn in range(turns):
                messages.append({"role": "user", "content": f"user {u} turn {turn} {time.monotonic()}: " + "x" * chars})
                body = {"model": peers.MODEL, "messages": messages, "max_tokens": 16}
                async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                    reply = await resp.json()
                    session = resp.headers["x-session-id"]
                calls += 1
                if first is None:
                    first = session
                else:
                    later += 1
                    linked += session == first
                messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
                if time.monotonic() >= stop:
                    return
                await asyncio.sleep(think_s)

    start = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=new_connections)) as http:
        await asyncio.gather(*(user(http, u) for u in range(users)))
    return calls, later, linked, time.monotonic() - start


def one(server: Server, db_url: str, args: argparse.Namespace) -> dict[str, float]:
    db_name = db_url.rsplit("/", 1)[1]
    cpu0, (pg0, _) = server.cpu_s(), postgres_cpu(db_name)
    calls, later, linked, wall = asyncio.run(
        converse(
            server.url,
            args.users,
            args.turns,
            args.turn_chars,
            args.think_ms / 1000,
            args.seconds,
            args.new_connections,
        )
    )
    wait_spool_empty(server.url)
    cpu, (pg, _) = server.cpu_s() - cpu0, postgres_cpu(db_name)
    return {
        "calls_s": calls / wall,
        "cpu_ms": cpu / calls * 1000,
        "pg_ms": (pg - pg0) / calls * 1000,
        "linked": linked / max(1, later),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--turn-chars", type=int, default=1500)
    parser.add_argument("--think-ms", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--checkout", type=Path, help="another checkout to run beside this one")
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="a new connection for every call (else kept alive, so turns often stay on one worker)",
    )
    args = parser.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-conversations-"))
    runs: dict[str, list[dict[str, float]]] = {"this": [], **({"other": []} if args.checkout else {})}
    with throwaway_database() as db_url:
        stub = peers.stub(logdir, None)
        servers = {
            "this": peers.onthejob(
                stub.url, db_url, logdir / "spool-this", logdir, None, record=True, name="this", workers=args.workers
            )
        }
        if args.checkout:
            servers["other"] = peers.onthejob(
                stub.url,
                db_url,
                logdir / "spool-other",
                logdir,
                None,
                record=True,
                name="other",
                workers=args.workers,
                checkout=args.checkout.resolve(),
            )
        try:
            for i in range(args.rounds):
                for name, server in rotated(list(servers.items()), i):
                    run = one(server, db_url, args)
                    runs[name].append(run)
                    print(
                        f"  {name:5s} {run['calls_s']:7,.0f} calls/s  CPU a call: server {run['cpu_ms']:.3f} ms, "
                        f"Postgres {run['pg_ms']:.3f} ms  turns linked {run['linked']:.3f}",
                        flush=True,
                    )
        finally:
            for server in (*servers.values(), stub):
                server.stop()
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(
        f"\n{args.users} users, {args.turns} turns of {args.turn_chars} characters, {args.think_ms:g} ms between "
        f"turns, {args.workers} workers; medians of {args.rounds} rounds:"
    )
    print("| server | calls/s | server CPU ms a call | Postgres CPU ms a call | turns linked |")
    print("|---|---:|---:|---:|---:|")
    for name, m in med.items():
        print(f"| {name} | {m['calls_s']:,.0f} | {m['cpu_ms']:.3f} | {m['pg_ms']:.3f} | {m['linked']:.3f} |")
    if "other" in med:
        t, o = med["this"], med["other"]
        print(
            f"this ÷ other: calls/s {t['calls_s'] / o['calls_s']:.2f}x, server CPU a call "
            f"{t['cpu_ms'] / o['cpu_ms']:.2f}x"
        )


if __name__ == "__main__":
    main()
