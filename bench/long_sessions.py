"""Long agent sessions through ``onthejob serve``: storage and proxy CPU as the conversation grows.

``--sessions`` unnamed sessions of ``--turns`` turns run side by side, every session opening with
the same ~40 KB system prompt and tool list (a coding agent's), each turn appending the reply and
one tool output of ``--tool-chars`` characters (sent as a user turn: the stub returns no tool
calls). The stub returns prompt ids as long as the prompt's tokens (``stub_prompt_ids: "chars/4"``),
so the recorded prompt ids weigh what an engine's would. Postgres records every call.

Printed:
- bytes stored for a session ÷ the bytes of one full record (today's form) of its last call,
  logical (the sum of the columns' lengths, ``octet_length(col::text)``, over the session's rows)
  and on disk (``pg_total_relation_size`` of ``completions`` and every table the stored form adds,
  ÷ the sessions). The denominator is the logical length of the last call's full record, read back
  through :mod:`storage.stored_read` where that exists (the delta form) or as stored (the full form);
  ``pg_column_size`` of the same rows (after compression) is printed beside it.
- the proxy's CPU a call beyond the bare pass-through's (``bench/passthrough.py``, the same bodies)
  for turns 1-10 and the last ten turns, and their ratio;
- req/s at c=16 for the call of ``--late-turn`` (default: three quarters in), proxy vs pass-through
  (measured last: those calls are recorded too, as siblings).

Both stored forms (``--forms full,delta``: ONTHEJOB_STORED_FORM, storage/stored_form.py) run one after
the other, each with its own proxy and database, and print side by side.

Run: ``.venv/bin/python -m bench.long_sessions [--turns 200] [--sessions 4] [--forms full,delta]`` (Postgres
on 127.0.0.1:5432, the stub engine, nothing pinned). A quick run: ``--turns 40 --sessions 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from bench import peers
from bench.harness import Server, throwaway_database, wait_spool_empty

_rng = random.Random(1)
VOCABULARY = [
    "".join(_rng.choice("abcdefghijklmnopqrstuvwxyz_.()") for _ in range(_rng.randint(2, 10))) for _ in range(4000)
]
COLUMNS_SQL = """SELECT column_name FROM information_schema.columns
                 WHERE table_name = 'completions' AND table_schema = 'public'"""


def prose(rng: random.Random, chars: int) -> str:
    """``chars`` characters of words drawn from a vocabulary: compresses about as text and code do
    (a run of one letter would let TOAST hide what is stored)."""
    words: list[str] = []
    size = 0
    while size < chars:
        words.append(VOCABULARY[rng.randrange(len(VOCABULARY))])
        size += len(words[-1]) + 1
    return " ".join(words)[:chars]


def shared_prefix(system_chars: int) -> tuple[str, list[dict[str, Any]]]:
    """The harness's system prompt and tool list, the same for every session (~``system_chars`` in all)."""
    rng = random.Random(7)
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}}
    tools = [
        {
            "type": "function",
            "function": {"name": f"tool_{i}", "description": prose(rng, 600), "parameters": parameters},
        }
        for i in range(16)
    ]
    return prose(rng, max(0, system_chars - 16 * 700)), tools


def body_for(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": peers.MODEL, "messages": messages, "tools": tools, "max_tokens": 32, "stub_prompt_ids": "chars/4"}


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        reply = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {reply}")
        return {"reply": reply, "session": resp.headers.get("x-session-id")}


async def run_sessions(proxy: Server, bare: Server, args: argparse.Namespace) -> dict[str, Any]:
    system, tools = shared_prefix(args.system_chars)
    rng = random.Random(11)
    histories = [[{"role": "system", "content": system}] for _ in range(args.sessions)]
    first_block, last_block = range(min(10, args.turns)), range(max(0, args.turns - 10), args.turns)
    cpu: dict[str | None, dict[str, float]] = {
        "first": {"proxy": 0.0, "bare": 0.0},
        "last": {"proxy": 0.0, "bare": 0.0},
    }
    calls: dict[str | None, int] = {"first": 0, "last": 0}
    late_body: dict[str, Any] = {}
    sessions: list[set[str]] = [set() for _ in histories]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for turn in range(args.turns):
            block = "first" if turn in first_block else "last" if turn in last_block else None
            for s, h in enumerate(histories):
                h.append({"role": "user", "content": f"tool output {s}.{turn}: " + prose(rng, args.tool_chars)})
            bodies = [body_for(h, tools) for h in histories]
            if turn == args.late_turn:
                late_body = bodies[0]
            starts = block and turn == (first_block[0] if block == "first" else last_block[0])
            ends = block and turn == (first_block[-1] if block == "first" else last_block[-1])
            if starts:
                await asyncio.to_thread(wait_spool_empty, proxy.url)
                cpu[block]["proxy"] -= proxy.cpu_s()
            out = await asyncio.gather(*(post(http, proxy.url, b) for b in bodies))
            if block:
                b0 = bare.cpu_s()
                await asyncio.gather(*(post(http, bare.url, {**b, "return_token_ids": True}) for b in bodies))
                cpu[block]["bare"] += bare.cpu_s() - b0
                calls[block] += len(bodies)
            if ends:  # the proxy's CPU over the block's turns, recording included
                await asyncio.to_thread(wait_spool_empty, proxy.url)
                cpu[block]["proxy"] += proxy.cpu_s()
            for h, o, seen in zip(histories, out, sessions, strict=True):
                h.append({"role": "assistant", "content": o["reply"]["choices"][0]["message"].get("content")})
                seen.add(o["session"])
            if turn % 20 == 19:
                print(f"  turn {turn + 1}/{args.turns}", flush=True)
        await asyncio.to_thread(wait_spool_empty, proxy.url)
    extra = {b: (cpu[b]["proxy"] - cpu[b]["bare"]) / max(1, calls[b]) * 1000 for b in cpu}
    return {"extra_ms": extra, "late_body": late_body, "sessions_per_conversation": [len(s) for s in sessions]}


def storage(db_url: str) -> dict[str, float]:
    """Bytes a session: logical and on disk, ÷ the last call's full record."""
    with psycopg.connect(db_url) as conn:
        cols = [r[0] for r in conn.execute(COLUMNS_SQL).fetchall()]
        length = " + ".join(f"coalesce(octet_length({c}::text), 0)" for c in cols)
        packed = " + ".join(f"coalesce(pg_column_size({c}), 0)" for c in cols)
        sessions_sql = f"SELECT session_id, count(*), sum({length}), sum({packed}) FROM completions GROUP BY session_id"
        rows = conn.execute(sessions_sql).fetchall()
        tables_sql = (
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
            "(tablename = 'completions' OR tablename LIKE 'stored_%')"
        )
        tables = [r[0] for r in conn.execute(tables_sql).fetchall()]
        disk = sum(conn.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()[0] for t in tables)  # type: ignore[index]
        last_sql = "SELECT DISTINCT ON (session_id) id FROM completions ORDER BY session_id, created_at DESC"
        last_ids = [r[0] for r in conn.execute(last_sql).fetchall()]
        full = [full_record_bytes(conn, i, cols) for i in last_ids]
        extra = shared_tables_logical(conn, tables)
        breakdown = where_bytes_go(conn, cols, tables)
    n = len(rows)
    logical = (sum(int(r[2]) for r in rows) + extra) / n
    packed_b = sum(int(r[3]) for r in rows) / n
    ref = sum(full) / len(full)
    return {
        "sessions": n,
        "calls": sum(int(r[1]) for r in rows) / n,
        "logical": logical,
        "packed": packed_b,
        "disk": disk / n,
        "full_last": ref,
        "tables": len(tables),
        "breakdown": {k: v / n for k, v in breakdown.items()},
    }


def shared_tables_logical(conn: psycopg.Connection[Any], tables: list[str]) -> int:
    """The logical bytes of the tables the stored form adds (every column's text), over all sessions."""
    total = 0
    for table in tables:
        if table == "completions":
            continue
        sql = "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema = 'public'"
        cols = [r[0] for r in conn.execute(sql, (table,)).fetchall()]
        length = " + ".join(f"coalesce(octet_length({c}::text), 0)" for c in cols)
        total += int(conn.execute(f"SELECT coalesce(sum({length}), 0) FROM {table}").fetchone()[0])  # type: ignore[index]
    return total


def where_bytes_go(conn: psycopg.Connection[Any], cols: list[str], tables: list[str]) -> dict[str, int]:
    """Over all sessions: each completions column's logical bytes and pg_column_size, then each table's
    heap, TOAST and indexes on disk (what ``--breakdown`` prints, largest first)."""
    logical = ", ".join(f"coalesce(sum(octet_length({c}::text)), 0)" for c in cols)
    packed = ", ".join(f"coalesce(sum(pg_column_size({c})), 0)" for c in cols)
    row = conn.execute(f"SELECT {logical}, {packed} FROM completions").fetchone() or ()
    out = {f"completions.{c} logical": int(row[i]) for i, c in enumerate(cols)}
    out |= {f"completions.{c} pg_column_size": int(row[len(cols) + i]) for i, c in enumerate(cols)}
    for t in tables:
        sizes = "SELECT pg_relation_size(c.oid), coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), "
        sizes += "pg_indexes_size(c.oid) FROM pg_class c WHERE c.relname = %s"
        heap, toast, index = conn.execute(sizes, (t,)).fetchone() or (0, 0, 0)
        out |= {f"{t}: heap on disk": int(heap), f"{t}: TOAST on disk": int(toast), f"{t}: indexes on disk": int(index)}
    return out


def full_record_bytes(conn: psycopg.Connection[Any], call_id: str, cols: list[str]) -> int:
    """The logical length of one call's record in today's (full) form."""
    length = ", ".join(f"coalesce(octet_length({c}::text), 0)" for c in cols)
    values = conn.execute(f"SELECT {length} FROM completions WHERE id = %s", (call_id,)).fetchone() or ()
    sizes = dict(zip(cols, values, strict=True))
    try:
        from storage import stored_read  # type: ignore[attr-defined,unused-ignore]  # the delta form's reader
    except ImportError:  # a checkout from before the delta form (a "before" run): every row is in full
        return sum(sizes.values())
    full = stored_read.full_columns_sync(conn, call_id)  # {column: its text in today's form}
    sizes.update({c: len(v.encode()) for c, v in full.items()})
    return sum(sizes.values())


async def rate(url: str, body: dict[str, Any], concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await post(http, url, body)
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--tool-chars", type=int, default=3000)
    parser.add_argument("--system-chars", type=int, default=40_000, help="system prompt + tool list")
    parser.add_argument("--late-turn", type=int, help="the turn whose call req/s is measured (0-based)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate-seconds", type=float, default=8.0)
    parser.add_argument(
        "--forms",
        default="full,delta",
        help="the stored forms to run, one after the other (ONTHEJOB_STORED_FORM of the proxy)",
    )
    args = parser.parse_args()
    if args.turns < 20:
        parser.error("--turns: at least 20 (the first ten turns and the last ten are measured apart)")
    args.late_turn = min(args.turns - 1, args.late_turn if args.late_turn is not None else args.turns * 3 // 4)
    out = {form: one(args, form) for form in args.forms.split(",")}
    print(
        f"\n{args.sessions} sessions x {args.turns} turns, tool outputs of {args.tool_chars} characters, "
        f"a {args.system_chars:,}-character shared prefix:"
    )
    print("| figure | " + " | ".join(out) + " |")
    print("|---|" + "---:|" * len(out))
    for name in out[next(iter(out))]:
        print(f"| {name} | " + " | ".join(o[name] for o in out.values()) + " |")


def one(args: argparse.Namespace, form: str) -> dict[str, str]:
    """One run with the proxy storing ``form``; its figures as printed."""
    os.environ["ONTHEJOB_STORED_FORM"] = form  # the proxy inherits it (bench/harness.py start_server)
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-long-sessions-"))
    with throwaway_database() as db_url:
        stub = peers.stub(logdir, None)
        proxy = peers.onthejob(stub.url, db_url, logdir / "spool", logdir, None, record=True, name="proxy")
        bare = peers.passthrough(stub.url, logdir, None)
        try:
            t0 = time.monotonic()
            run = asyncio.run(run_sessions(proxy, bare, args))
            wall = time.monotonic() - t0
            st = storage(db_url)
            late, k, secs = run["late_body"], args.concurrency, args.rate_seconds
            rates = {
                "bare": asyncio.run(rate(bare.url, {**late, "return_token_ids": True}, k, secs)),
                "proxy": asyncio.run(rate(proxy.url, late, k, secs)),
            }
        finally:
            for server in (proxy, bare, stub):
                server.stop()
    first, last, full = run["extra_ms"]["first"], run["extra_ms"]["last"], st["full_last"]
    print(f"  {form}: {wall:.0f} s; sessions a conversation: {run['sessions_per_conversation']}", flush=True)
    print(f"  {form}: where a session's bytes go (÷ the last call's full record), largest first:")
    for name, size in sorted(st["breakdown"].items(), key=lambda kv: -kv[1]):
        if size >= full / 1000:
            print(f"    {name:<48} {size / 1e3:>10,.1f} kB  {size / full:6.3f}x")
    rate_figure = f"req/s at c={args.concurrency}, turn {args.late_turn + 1}: proxy / pass-through"
    rate_ratio = f"{rates['proxy']:.1f} / {rates['bare']:.1f} = {rates['proxy'] / rates['bare']:.2f}x"
    return {
        "calls a session": f"{st['calls']:.0f}",
        "full record of the last call (logical)": f"{full / 1e3:,.1f} kB",
        "stored a session, logical": f"{st['logical'] / 1e6:,.2f} MB = {st['logical'] / full:.2f}x",
        "stored a session, pg_column_size": f"{st['packed'] / 1e6:,.2f} MB = {st['packed'] / full:.2f}x",
        f"stored a session, on disk ({st['tables']} tables)": f"{st['disk'] / 1e6:,.2f} MB = {st['disk'] / full:.2f}x",
        "proxy CPU a call beyond the pass-through, turns 1-10": f"{first:.2f} ms",
        "the same, the last ten turns": f"{last:.2f} ms",
        "last ten ÷ first ten": f"{last / first:.2f}x",
        rate_figure: rate_ratio,
    }


if __name__ == "__main__":
    main()
