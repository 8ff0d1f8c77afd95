"""SIGKILL the proxy under load, restart it on the same spool: every acknowledged call recorded, none twice (issue 7).

The stub upstream and ``onthejob serve`` (recording on, a throwaway database on
127.0.0.1:5432, dropped at the end). ``--clients`` closed-loop clients, alternating
streamed and non-streamed calls, run throughout. ``--kills`` times: after
``--interval`` s of load the proxy gets SIGKILL, stays down ``--down`` s (clients
see refused connections and retry under new ids), and is restarted on the same port
and the same spool folder. After the last restart the load runs ``--interval`` s
more, stops, the spool drains, and it prints acknowledged (replies received in full:
``data: [DONE]`` or a complete JSON body, status 200) vs recorded vs missing, the
duplicates, and the rows of calls that were cut by a kill (recorded but never
acknowledged: allowed, a call is spooled before its final byte). Exit status 0 only
when missing == 0 and duplicated == 0.

Run: ``.venv/bin/python -m bench.kill_restart`` (defaults: 32 clients, 3 kills, 8 s apart).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness import Server, free_port, machine_description, throwaway_database, wait_spool_empty
from bench.reliability import (
    Tally,
    loadavg,
    percentiles,
    proxy_cmd,
    reconcile,
    run_clients,
    run_within,
    spawn,
    start_stub,
    wait_ready,
)


async def _scenario(
    args: argparse.Namespace, first: Server, restart: Callable[[], Server], log: list[str]
) -> tuple[Tally, Server]:
    t0 = time.monotonic()

    def mark(what: str) -> None:
        log.append(f"  t={time.monotonic() - t0:6.1f} s  {what}")
        print(log[-1], flush=True)

    stop = asyncio.Event()
    load = asyncio.create_task(
        run_clients(
            first.port, stop, clients=args.clients, mix="mixed", tokens=args.tokens, gap_ms=args.gap_ms, run_id="kill"
        )
    )
    proxy = first
    mark("load started")
    for k in range(args.kills):
        await asyncio.sleep(args.interval)
        proxy.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proxy.proc.wait, 30)
        mark(f"kill {k + 1}: proxy pid {proxy.proc.pid} SIGKILLed")
        await asyncio.sleep(args.down)
        # Spawned from this (the main) thread: a child spawned from a worker thread would get
        # its death signal when that thread exits. Only the readiness wait runs in a thread.
        proxy = await asyncio.to_thread(wait_ready, restart())
        mark(f"kill {k + 1}: restarted on the same spool (pid {proxy.proc.pid})")
    await asyncio.sleep(args.interval)
    stop.set()
    tally = await load
    mark("load stopped")
    await asyncio.to_thread(wait_spool_empty, proxy.url, args.drain_timeout)
    mark("spool empty")
    return tally, proxy


def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine_description()}")
    print(
        f"load: {args.clients} clients, streamed and non-streamed calls alternating, {args.tokens} tokens a reply, "
        f"{args.gap_ms} ms between chunks; {args.kills} SIGKILL(s), {args.interval:.0f} s apart"
    )
    procs: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="onthejob-kill-") as tmp, throwaway_database() as db_url:
        logdir = Path(tmp)
        spool, port = logdir / "spool", free_port()
        try:
            stub = start_stub(logdir)
            procs.append(stub)

            def restart() -> Server:
                procs.append(
                    spawn("proxy", proxy_cmd(stub.url, db_url, spool, port), port, logdir, env={"ONTHEJOB_RECORD": "1"})
                )
                return procs[-1]

            first = wait_ready(restart())
            marks: list[str] = []
            tally, last = asyncio.run(_scenario(args, first, restart, marks))
            load_end = loadavg()
            rec = reconcile(tally, db_url)
            alive = last.proc.poll() is None
        finally:
            for p in reversed(procs):
                p.stop()

    print()
    print(f"requests sent        {tally.sent}")
    print(f"acknowledged         {rec.acked}  ({tally.acked_stream} streamed, {rec.acked - tally.acked_stream} not)")
    cut = tally.sent - rec.acked
    print(f"cut by a kill        {cut}  (sent, then the connection died before the reply was complete)")
    print(f"refused connects     {tally.failures['connect']}  (retried every 50 ms while the proxy was down)")
    other = {k: v for k, v in tally.failures.items() if k not in ("connect", "connection")}
    if other:
        print(f"other failures       {other}")
    for example in tally.examples:
        print(f"   e.g. {example}")
    print(f"latency (full reply) {percentiles(tally.latency_ms)}")
    print(f"load average         {load_end} at the end")
    print(f"recorded             {rec.recorded} of {rec.acked} acknowledged")
    print(f"missing              {len(rec.missing)}" + (f"  e.g. {rec.missing[:5]}" if rec.missing else ""))
    print(f"duplicated           {rec.duplicated}")
    print(f"rows in database     {rec.rows}  terminations {dict(rec.terminations)}")
    print(f"recorded, not acked  {rec.unacked_rows}  (calls cut by a kill after they were spooled)")
    print(f"proxy alive at end   {alive}")
    ok = not rec.missing and rec.duplicated == 0 and rec.acked > 0 and alive
    print("RESULT: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--interval", type=float, default=8.0, help="seconds of load before each kill, and after")
    parser.add_argument("--down", type=float, default=1.0, help="seconds the proxy stays down")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    args = parser.parse_args()
    run_within(run, args, (args.kills + 1) * (args.interval + args.down + 90) + args.drain_timeout + 120)


if __name__ == "__main__":
    main()
