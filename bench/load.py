"""Load: 200 concurrent streaming clients against the recording proxy for 5 minutes (issue 7).

Starts the stub upstream and ``onthejob serve`` (recording on, a throwaway Postgres
database on 127.0.0.1:5432 created here and dropped at the end), runs ``--clients``
closed-loop streaming clients for ``--duration`` seconds, then waits for the spool
to drain and prints:

- errors (must be 0): connection failures, non-200 answers, streams that did not end
  with ``data: [DONE]`` or carried an error event;
- requests (and requests/s, latency and time-to-first-event percentiles);
- the proxy's RSS (``VmRSS`` from ``/proc/<pid>/status``) at start, a few samples
  during the run, and at the end;
- records == responses: the ``x-request-id`` of every completed response against the
  rows of ``completions`` once the spool is empty (missing, extra, duplicated).

Reading RSS: the proxy keeps a bounded in-memory cache of session link keys
(``proxy.sessions.LinkCache``, 100,000 entries, about 0.5 KB each here), and every
call of this load adds one, so RSS climbs by up to ~50-70 MiB over the first
~100,000 calls and should then stay flat; growth past that is a leak.

Everything listens on 127.0.0.1 only; every process it starts dies with it, and the
whole run is bounded (``--duration`` + drain timeout + a margin). Exit status 0 only
when errors == 0 and records == responses.

Run: ``.venv/bin/python -m bench.load`` (``--duration 30`` for a quick check).

The processes, clients and reconciliation it uses are in ``bench/reliability.py``, shared
with ``bench/db_outage.py`` and ``bench/kill_restart.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Server, machine_description, throwaway_database, wait_spool_empty
from bench.reliability import (
    Tally,
    loadavg,
    percentiles,
    reconcile,
    run_clients,
    run_within,
    start_proxy,
    start_stub,
    tree_rss_kib,
)

# ---------------------------------------------------------------- the load run


async def _load(args: argparse.Namespace, proxy: Server) -> tuple[Tally, list[tuple[float, int, int]]]:
    stop = asyncio.Event()
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()

    async def sampler() -> None:
        interval = max(1.0, args.duration / args.rss_samples)
        while not stop.is_set():
            samples.append((time.monotonic() - t0, *tree_rss_kib(proxy.proc.pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    asyncio.get_running_loop().call_later(args.duration, stop.set)
    sampling = asyncio.create_task(sampler())
    tally = await run_clients(
        proxy.port, stop, clients=args.clients, mix="stream", tokens=args.tokens, gap_ms=args.gap_ms, run_id="load"
    )
    await sampling
    samples.append((time.monotonic() - t0, *tree_rss_kib(proxy.proc.pid)))
    return tally, samples


def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine_description()}")
    print(
        f"load: {args.clients} streaming clients for {args.duration:.0f} s; stub: {args.tokens} tokens a reply, "
        f"{args.gap_ms} ms between chunks; recording on (Postgres 127.0.0.1:5432, throwaway database)"
    )
    sys.stdout.flush()
    with tempfile.TemporaryDirectory(prefix="onthejob-load-") as tmp, throwaway_database() as db_url:
        logdir = Path(tmp)
        stub = start_stub(logdir)
        proxy = None
        try:
            proxy = start_proxy(stub.url, db_url, logdir / "spool", logdir, workers=args.workers)
            rss_idle = tree_rss_kib(proxy.proc.pid)[0]
            tally, samples = asyncio.run(_load(args, proxy))
            load_end = loadavg()
            t = time.monotonic()
            drained = True
            try:
                wait_spool_empty(proxy.url, timeout_s=args.drain_timeout)
            except RuntimeError as exc:
                drained = False
                print(f"!! {exc}")
            drain_s = time.monotonic() - t
            rec = reconcile(tally, db_url)
            rss_drained = tree_rss_kib(proxy.proc.pid)[0]
            alive = proxy.proc.poll() is None
        finally:
            if proxy is not None:
                proxy.stop()
            stub.stop()

    wall = max(tally.t_last - tally.t_first, 1e-9)
    responses = tally.sent - sum(v for k, v in tally.failures.items() if k in ("connection", "timeout"))
    print()
    print(f"requests sent        {tally.sent}")
    print(f"responses in full    {len(tally.acked)}  ({len(tally.acked) / wall:.0f}/s over {wall:.0f} s)")
    print(f"errors               {tally.errors}  {dict(tally.failures) or ''}")
    for example in tally.examples:
        print(f"   e.g. {example}")
    print(f"latency (full reply) {percentiles(tally.latency_ms)}")
    print(f"first event          {percentiles(tally.first_event_ms)}")
    print(f"load average         {load_end} at the end of the load")
    print()
    print(f"proxy RSS (VmRSS; VmHWM = peak so far; {args.workers} worker(s), summed over the process tree)")
    print(f"   before load        {rss_idle / 1024:7.1f} MiB")
    for at, rss, hwm in samples:
        print(f"   t={at:6.1f} s         {rss / 1024:7.1f} MiB   (HWM {hwm / 1024:.1f} MiB)")
    print(f"   after the drain    {rss_drained / 1024:7.1f} MiB")
    first_loaded = samples[1][1] if len(samples) > 2 else samples[0][1]
    print(f"   growth from the first loaded sample to the end: {(samples[-1][1] - first_loaded) / 1024:+.1f} MiB")
    print()
    print(
        f"spool drained in     {drain_s:.1f} s after the load stopped"
        if drained
        else f"spool NOT drained after {drain_s:.0f} s"
    )
    print(f"responses            {responses}  (every answer the clients received, any status)")
    print(f"rows in completions  {rec.rows}  terminations {dict(rec.terminations)}")
    print(
        f"acknowledged         {rec.acked}; recorded {rec.recorded}; missing {len(rec.missing)}; "
        f"duplicated {rec.duplicated}; rows no client saw in full {rec.unacked_rows}"
    )
    if rec.missing:
        print(f"   missing e.g. {rec.missing[:5]}")
    equal = rec.rows == responses and not rec.missing and rec.duplicated == 0
    print(f"records == responses {'yes' if equal else 'NO'} ({rec.rows} == {responses})")
    print(f"proxy alive at end   {alive}")
    ok = tally.errors == 0 and equal and alive and drained
    print("RESULT: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens a reply (one SSE chunk each)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="stub gap between chunks")
    parser.add_argument("--workers", type=int, default=1, help="onthejob serve --workers (RSS is summed over them)")
    parser.add_argument("--rss-samples", type=int, default=6, help="RSS samples during the load")
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    args = parser.parse_args()
    run_within(run, args, args.duration + args.drain_timeout + 300)


if __name__ == "__main__":
    main()
