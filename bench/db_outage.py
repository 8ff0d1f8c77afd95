"""Postgres stopped for 30 s under load: nothing lost, nothing duplicated (issue 7).

A throwaway Postgres cluster (``tests.pg_cluster.PgCluster``: initdb into a temp
folder, its own port on 127.0.0.1, run as the ``postgres`` user when we are root),
the stub upstream and ``onthejob serve`` (recording on). ``--clients`` closed-loop
clients, alternating streamed and non-streamed calls, run for the whole timeline:

    --before s of load  →  pg_ctl stop (fast)  →  --outage s  →  pg_ctl start  →  --after s of load

then the load stops, the spool drains, and it prints: responses received in full,
failed calls (should be 0: the proxy serves from the spool while the database is
down), records in the database, lost (acknowledged but not recorded; must be 0),
duplicated (0), the spool depth peak (from ``/readyz``, polled every 0.25 s) and the
drain times. Exit status 0 only when lost == 0, duplicated == 0 and nothing failed.

Run: ``.venv/bin/python -m bench.db_outage`` (defaults: 32 clients, 10 s / 30 s / 15 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness import Server, machine_description, wait_spool_empty
from bench.reliability import Tally, loadavg, percentiles, reconcile, run_clients, run_within, start_proxy, start_stub
from tests.pg_cluster import PgCluster


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}
        self.depth: list[tuple[float, int, str]] = []  # (t, spool depth, database up/down)

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic() - self.t0
        print(f"  t={self.marks[name]:6.1f} s  {name}", flush=True)


async def _monitor(proxy: Server, stop: asyncio.Event, tl: Timeline) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                body = (await client.get(f"{proxy.url}/readyz")).json()
                tl.depth.append((time.monotonic() - tl.t0, int(body["spool"]["depth"]), body["database"]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


async def _scenario(args: argparse.Namespace, proxy: Server, cluster: PgCluster, tl: Timeline) -> Tally:
    stop_load, stop_monitor = asyncio.Event(), asyncio.Event()
    monitor = asyncio.create_task(_monitor(proxy, stop_monitor, tl))
    load = asyncio.create_task(
        run_clients(
            proxy.port,
            stop_load,
            clients=args.clients,
            mix="mixed",
            tokens=args.tokens,
            gap_ms=args.gap_ms,
            run_id="outage",
        )
    )
    tl.mark("load started")
    await asyncio.sleep(args.before)
    tl.mark("stopping Postgres")
    await asyncio.to_thread(cluster.stop)
    tl.mark("Postgres stopped")
    await asyncio.sleep(args.outage)
    tl.mark("starting Postgres")
    await asyncio.to_thread(cluster.start)
    tl.mark("Postgres started")
    await asyncio.sleep(args.after)
    stop_load.set()
    tally = await load
    tl.mark("load stopped")
    await asyncio.to_thread(wait_spool_empty, proxy.url, args.drain_timeout)
    tl.mark("spool empty")
    stop_monitor.set()
    await monitor
    return tally


def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine_description()}")
    print(
        f"load: {args.clients} clients, streamed and non-streamed calls alternating, {args.tokens} tokens a reply, "
        f"{args.gap_ms} ms between chunks; Postgres down for {args.outage:.0f} s"
    )
    cluster = PgCluster()
    stub = proxy = None
    try:
        with tempfile.TemporaryDirectory(prefix="onthejob-outage-") as tmp:
            logdir = Path(tmp)
            cluster.start()
            stub = start_stub(logdir)
            proxy = start_proxy(stub.url, cluster.url, logdir / "spool", logdir)
            tl = Timeline()
            tally = asyncio.run(_scenario(args, proxy, cluster, tl))
            load_end = loadavg()
            rec = reconcile(tally, cluster.url)
            alive = proxy.proc.poll() is None
            log_tail = proxy.log.read_text()
    finally:
        for p in (proxy, stub):
            if p is not None:
                p.stop()
        cluster.destroy()

    m = tl.marks
    down, up = m["Postgres stopped"], m["Postgres started"]
    before = [d for t, d, _ in tl.depth if t < m["stopping Postgres"]]
    during = [d for t, d, _ in tl.depth if down <= t <= up]
    peak_t, peak = max(((t, d) for t, d, _ in tl.depth), key=lambda x: x[1], default=(0.0, 0))
    steady = max(before, default=0)  # the backlog the recorder carries in normal operation
    cleared = next((t for t, d, _ in tl.depth if t > up and d <= steady), None)
    db_seen_down = [t for t, _, db in tl.depth if db == "down"]
    print()
    print(
        f"outage               Postgres down from t={down:.1f} s to t={up:.1f} s ({up - down:.1f} s); "
        f"/readyz said database down from t={min(db_seen_down, default=float('nan')):.1f} "
        f"to t={max(db_seen_down, default=float('nan')):.1f} s"
    )
    print(f"requests sent        {tally.sent}")
    print(
        f"responses in full    {len(tally.acked)}  ({tally.acked_stream} streamed, "
        f"{len(tally.acked) - tally.acked_stream} not)"
    )
    print(f"failed calls         {tally.errors}  {dict(tally.failures) or ''}")
    for example in tally.examples:
        print(f"   e.g. {example}")
    print(f"latency (full reply) {percentiles(tally.latency_ms)}")
    print(f"load average         {load_end} at the end")
    print(f"records in database  {rec.rows}  terminations {dict(rec.terminations)}")
    print(f"recorded             {rec.recorded} of {rec.acked} acknowledged")
    print(f"lost                 {len(rec.missing)}" + (f"  e.g. {rec.missing[:5]}" if rec.missing else ""))
    print(f"duplicated           {rec.duplicated}")
    print(f"rows no client saw   {rec.unacked_rows}")
    print(
        f"spool depth          steady before the outage <= {steady}; peak {peak} at t={peak_t:.1f} s "
        f"(max while down: {max(during, default=0)})"
    )
    if cleared is not None:
        print(
            f"backlog cleared      {cleared - up:.1f} s after Postgres was back (depth <= {steady} again, "
            f"load still running)"
        )
    else:
        print("backlog cleared      not while the load ran")
    print(f"spool empty          {m['spool empty'] - m['load stopped']:.1f} s after the load stopped")
    print(f"proxy alive at end   {alive}")
    warnings = sum(1 for line in log_tail.splitlines() if "database write failed" in line)
    print(f"proxy log            {warnings} 'database write failed' retries logged")
    ok = not rec.missing and rec.duplicated == 0 and tally.errors == 0 and alive
    print("RESULT: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before Postgres stops")
    parser.add_argument("--outage", type=float, default=30.0, help="seconds Postgres stays down")
    parser.add_argument("--after", type=float, default=15.0, help="seconds of load after it is back")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    args = parser.parse_args()
    run_within(run, args, args.before + args.outage + args.after + args.drain_timeout + 300)


if __name__ == "__main__":
    main()
