"""Two proxy hosts on one database: do unnamed sessions split between them, and does a key's limit hold?

Issue 37's "Several proxy hosts, one truth", run on one machine: two ``onthejob serve``
processes, each with its own spool root and host id (``--host-id a`` / ``b``), each in front
of its own stub engine (bench/stub_upstream.py), one throwaway Postgres database. A stub is
enough here: what is measured is our own linking and our own limits, not the engine; a
real engine only makes the replies slower, which gives the database more time, not less.

(a) **Session splits.** Twice: with the link feed off (``ONTHEJOB_LINK_FEED=0``: a turn finds a
    parent the other host answered once that host's recorder has moved it into the database) and on
    (proxy/link_feed.py: each host writes its calls' link keys as their replies end).
    ``--conversations`` (500) conversations of ``--turns`` (10) turns, an
    OpenAI chat history resent each turn, no session named (the proxy links each turn to its
    parent by messages). Turn t of conversation i goes to host (i + t) % 2: round-robin, so
    every turn lands on the other host from the one that answered its parent, and the next
    turn is sent as soon as the reply has ended (agent speed, no think time), ``--concurrency``
    conversations at once. Then, once both spools drained, the database is asked how many
    conversations ended up in more than one session (a *split*), and how many turns name as
    their parent a call other than the previous turn (a *mislink*: same session, wrong parent).

(b) **One key's limit across hosts.** Both hosts restart with auth and
    ``ONTHEJOB_RATE_LIMIT_RPS=--limit`` (burst ``--burst``); one API key is driven open-loop at
    2x its limit for ``--seconds`` (60), split 50/50 and then 90/10 between the hosts. Printed:
    admitted requests/s (HTTP 200) over the limit for both hosts together (target: within 10%
    of 1.0), and per host; the same after the first ``--settle`` seconds, when leases are held.

Run: ``.venv/bin/python -m bench.two_hosts [--conversations 50] [--seconds 10]`` (Postgres on
127.0.0.1:5432, user postgres, trust auth; a throwaway database is created and dropped; every
process started here is stopped on exit). ``--only splits|limits`` runs one part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import peers
from bench.harness import PY, ROOT, Server, free_port, machine_description, start_server, throwaway_database
from bench.loadgen import pct

HOSTS = ("a", "b")


def serve(
    name: str, upstream: str, db_url: str, spool: Path, logdir: Path, *, auth: bool, env: dict[str, str]
) -> Server:
    """One ``onthejob serve`` host (one worker) with its own spool root and host id; migrations are run once
    beforehand, so the two never race."""
    port = free_port()
    cmd = [PY, "-m", "onthejob.cli", "serve", "--upstream", upstream, "--db", db_url, "--port", str(port)]
    cmd += ["--spool", str(spool), "--host-id", name, "--no-migrate", "--no-housekeep"]
    if not auth:
        cmd.append("--no-auth")
    return start_server(f"host-{name}", cmd, port, logdir, env={"PYTHONPATH": str(ROOT), **env})


@contextlib.contextmanager
def two_hosts(
    db_url: str, stubs: list[Server], logdir: Path, tag: str, *, auth: bool, env: dict[str, str]
) -> Iterator[list[Server]]:
    hosts: list[Server] = []
    try:
        for name, stub in zip(HOSTS, stubs, strict=True):
            hosts.append(serve(name, stub.url, db_url, logdir / f"spool-{tag}-{name}", logdir, auth=auth, env=env))
        see_each_other(hosts)
        yield hosts
    finally:
        for host in hosts:
            host.stop()


def see_each_other(hosts: list[Server], timeout_s: float = 30.0) -> None:
    """Wait until every host counts them all live (presence rows, renewed about every second), as hosts that
    have run for a while do: a host that still counts itself alone neither waits for the other's parents nor
    writes link entries, so a run started sooner measures the hosts' start, not linking."""
    import httpx

    deadline = time.monotonic() + timeout_s
    for host in hosts:
        while httpx.get(f"{host.url}/readyz", timeout=5).json().get("hosts") != len(hosts):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name} never saw the other hosts")
            time.sleep(0.2)


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        data = await resp.json(content_type=None)
        return resp.status, data, {k.lower(): v for k, v in resp.headers.items()}


# ---------------------------------------------------------------- (a) splits


@dataclass
class Conversation:
    calls: list[str]  # completion ids, turn by turn
    sessions: list[str]  # x-session-id of each reply
    ms: list[float]  # each turn's time from sending to the reply's end


async def conversations(hosts: list[Server], n: int, turns: int, concurrency: int) -> list[Conversation]:
    """Run ``n`` conversations, turn t of conversation i on host (i + t) % 2, at agent speed."""
    run = os.urandom(4).hex()
    out: list[Conversation] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        async with gate:
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
            conv = Conversation([], [], [])
            for t in range(turns):
                text = f"conversation {run}-{i}: the task" if t == 0 else f"tool result {t}: ok"
                messages.append({"role": "user", "content": text})
                body = {"model": peers.MODEL, "messages": messages, "max_tokens": 8}
                sent = time.perf_counter()
                status, reply, headers = await post(http, hosts[(i + t) % len(hosts)].url, body)
                conv.ms.append((time.perf_counter() - sent) * 1000)
                if status != 200:
                    raise RuntimeError(f"turn {t} of conversation {i}: HTTP {status} {reply}")
                conv.calls.append(headers["x-request-id"])
                conv.sessions.append(headers["x-session-id"])
                messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            out.append(conv)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(one(http, i) for i in range(n)))
    return out


def landed(db_url: str, convs: list[Conversation], timeout_s: float = 120.0) -> dict[str, tuple[str, str | None]]:
    """completion id -> (session, parent) from the database, once every call of ``convs`` is there."""
    import psycopg

    ids = [c for conv in convs for c in conv.calls]
    deadline = time.monotonic() + timeout_s
    while True:
        with psycopg.connect(db_url) as conn:
            rows = conn.execute(
                "SELECT id, session_id, parent_id FROM completions WHERE id = ANY(%s)", (ids,)
            ).fetchall()
        if len(rows) == len(ids) or time.monotonic() > deadline:
            return {r[0]: (r[1], r[2]) for r in rows}
        time.sleep(0.5)


def split_figures(convs: list[Conversation], rows: dict[str, tuple[str, str | None]]) -> dict[str, Any]:
    splits = mislinks = missing = header_splits = 0
    for conv in convs:
        sessions = {rows[c][0] for c in conv.calls if c in rows}
        missing += sum(c not in rows for c in conv.calls)
        splits += len(sessions) > 1
        header_splits += len(set(conv.sessions)) > 1
        mislinks += sum(
            1 for prev, call in zip(conv.calls, conv.calls[1:], strict=False) if rows.get(call, ("", None))[1] != prev
        )
    ms = [m for conv in convs for m in conv.ms]
    return {
        "p50_ms": round(pct(ms, 50)),
        "p99_ms": round(pct(ms, 99)),
        "conversations": len(convs),
        "calls": sum(len(c.calls) for c in convs),
        "splits": splits,
        "header_splits": header_splits,
        "mislinked_turns": mislinks,
        "missing_rows": missing,
    }


def link_lookups(host: Server) -> dict[str, Any]:
    """Where the host found its calls' parents (``onthejob_link_lookups`` by ``found_in``), and the mean wait
    for those another host answered (``onthejob_link_wait_seconds`` ÷ lookups, ms)."""
    import httpx

    counts: dict[str, int] = {}
    waited: dict[str, float] = {}
    for line in httpx.get(f"{host.url}/metrics", timeout=10).text.splitlines():
        if 'found_in="' not in line:
            continue
        found_in, value = line.split('found_in="')[1].split('"')[0], float(line.rsplit(" ", 1)[1])
        if line.startswith("onthejob_link_lookups_total{"):
            counts[found_in] = int(value)
        elif line.startswith("onthejob_link_wait_seconds_total{"):
            waited[found_in] = value
    out: dict[str, Any] = dict(counts)
    for found_in, seconds in waited.items():
        if counts.get(found_in):
            out[f"{found_in}_wait_ms"] = round(1000 * seconds / counts[found_in], 1)
    return out


def run_splits(
    args: argparse.Namespace, db_url: str, stubs: list[Server], logdir: Path, feed: bool = True
) -> dict[str, Any]:
    env = {} if feed else {"ONTHEJOB_LINK_FEED": "0"}
    with two_hosts(db_url, stubs, logdir, "splits" if feed else "splits-nofeed", auth=False, env=env) as hosts:
        t0 = time.monotonic()
        convs = asyncio.run(conversations(hosts, args.conversations, args.turns, args.concurrency))
        wall = time.monotonic() - t0
        rows = landed(db_url, convs)
        lookups = {h.name: link_lookups(h) for h in hosts}
    figures = split_figures(convs, rows)
    figures["lookups"] = lookups
    figures["wall_s"] = round(wall, 1)
    figures["calls_per_s"] = round(figures["calls"] / wall, 1)
    return figures


# ---------------------------------------------------------------- (b) limits


async def drive(
    hosts: list[Server], key: str, rate: float, split: tuple[float, float], seconds: float, settle: float
) -> dict[str, dict[str, int]]:
    """Open-loop: each host gets ``rate * share`` requests/s, evenly spaced; counts 200s per host, whole run
    and after ``settle`` seconds."""
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": peers.MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    counts = {h.name: {"sent": 0, "ok": 0, "limited": 0, "other": 0, "ok_settled": 0} for h in hosts}
    tasks: set[asyncio.Task[None]] = set()

    async def call(http: aiohttp.ClientSession, host: Server, settled: bool) -> None:
        c = counts[host.name]
        try:
            status, _, _ = await post(http, host.url, body, headers)
        except aiohttp.ClientError:
            status = -1
        kind = "ok" if status == 200 else "limited" if status == 429 else "other"
        c[kind] += 1
        if kind == "ok" and settled:
            c["ok_settled"] += 1

    async def sender(http: aiohttp.ClientSession, host: Server, per_s: float, start: float) -> None:
        if per_s <= 0:
            return
        i = 0
        while True:
            at = start + i / per_s
            if at >= start + seconds:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            counts[host.name]["sent"] += 1
            task = asyncio.create_task(call(http, host, at >= start + settle))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        start = time.monotonic() + 0.2
        await asyncio.gather(*(sender(http, h, rate * s, start) for h, s in zip(hosts, split, strict=True)))
        while tasks:
            await asyncio.gather(*list(tasks))
    return counts


def create_key(db_url: str) -> str:
    out = subprocess.run(
        [PY, "-m", "onthejob.cli", "keys", "create", "--db", db_url, "--name", "bench-two-hosts"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return out.stdout.strip().splitlines()[-1]


def run_limits(args: argparse.Namespace, db_url: str, stubs: list[Server], logdir: Path) -> list[dict[str, Any]]:
    key = create_key(db_url)
    env = {"ONTHEJOB_RATE_LIMIT_RPS": str(args.limit), "ONTHEJOB_RATE_LIMIT_BURST": str(args.burst)}
    results = []
    with two_hosts(db_url, stubs, logdir, "limits", auth=True, env=env) as hosts:
        for split in ((0.5, 0.5), (0.9, 0.1)):
            counts = asyncio.run(drive(hosts, key, 2 * args.limit, split, args.seconds, args.settle))
            results.append({"split": split, "counts": counts})
            time.sleep(4)  # the leases' demands forget this phase (smoothed over ~1 s renewals)
    return results


def print_limits(args: argparse.Namespace, results: list[dict[str, Any]]) -> bool:
    ok = True
    limit, seconds, settled_s = args.limit, args.seconds, args.seconds - args.settle
    print(f"\n(b) one key, limit {limit:g} req/s (burst {args.burst}), offered {2 * limit:g} req/s for {seconds:g} s")
    print(
        "| split a/b | admitted / limit, both | host a | host b | after settle, both | host a | host b | other errors |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        c = r["counts"]
        a, b = c["host-a"], c["host-b"]
        both = (a["ok"] + b["ok"]) / seconds / limit
        settled = (a["ok_settled"] + b["ok_settled"]) / settled_s / limit
        others = a["other"] + b["other"]
        ok = ok and abs(both - 1) <= 0.10 and others == 0
        print(
            f"| {r['split'][0]:.0%}/{r['split'][1]:.0%} | {both:.3f} | {a['ok'] / seconds / limit:.3f} | "
            f"{b['ok'] / seconds / limit:.3f} | {settled:.3f} | {a['ok_settled'] / settled_s / limit:.3f} | "
            f"{b['ok_settled'] / settled_s / limit:.3f} | {others} |"
        )
    print(f"  [{'met' if ok else 'MISSED'}] admitted within 10% of the limit across both hosts, whole run, no errors")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=50, help="conversations in flight at once")
    parser.add_argument("--limit", type=float, default=50.0, help="the key's limit, requests/s")
    parser.add_argument("--burst", type=int, default=100, help="the key's burst (serve's default)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds each split is driven")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the 'after settle' figures")
    parser.add_argument("--only", choices=("splits", "limits"))
    parser.add_argument("--db-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-bench-two-hosts-"))
    print(f"machine: {machine_description()}")
    print(f"logs: {logdir}")
    t0 = time.monotonic()
    ok = True
    with throwaway_database(args.db_admin) as db_url:
        subprocess.run([PY, "-m", "onthejob.cli", "db", "upgrade", "--db", db_url], check=True, cwd=ROOT)
        stubs: list[Server] = []
        try:
            stubs = [peers.stub(logdir, None) for _ in HOSTS]
            if args.only in (None, "splits"):
                print(f"\n(a) {args.conversations} conversations x {args.turns} turns, round-robin over 2 hosts")
                print("| link entries | calls | calls/s | turn p50 / p99 ms | split | mislinked turns | rows missing |")
                print("|---|---|---|---|---|---|---|")
                # Without the link feed (a parent is found once its row lands) and with it, in turns.
                for feed in (False, True):
                    f = run_splits(args, db_url, stubs, logdir, feed=feed)
                    share = f["splits"] / max(1, f["conversations"])
                    print(
                        f"| {'on' if feed else 'off'} | {f['calls']} | {f['calls_per_s']} | {f['p50_ms']} / "
                        f"{f['p99_ms']} | {f['splits']} ({share:.1%}) | {f['mislinked_turns']} | {f['missing_rows']} |"
                    )
                    print(f"  where parents were found, per host: {f['lookups']}")
                    good = f["splits"] == 0 and f["missing_rows"] == 0
                    print(
                        f"  [{'met' if good else 'MISSED'}] 0 splits ({f['splits']}; "
                        f"by reply headers {f['header_splits']})"
                    )
                    ok = ok and good
            if args.only in (None, "limits"):
                ok = print_limits(args, run_limits(args, db_url, stubs, logdir)) and ok
        finally:
            for stub in stubs:
                stub.stop()
    print(f"\nload average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}; total {time.monotonic() - t0:.0f} s")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
