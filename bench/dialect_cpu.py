"""Proxy CPU per call of each dialect, measured alternately in one proxy: a figure a busy machine blurs less.

``bench.dialects`` measures each configuration once, minutes apart; on a shared machine
its req/s ratios swing by ±0.3 and its CPU column by ±15 %. Here one recording proxy in
front of the stub serves short batches of each dialect in turn (the order reversed every
round), after a warm-up that fills its recent-calls memory, and the proxy's own CPU
seconds per call are compared round by round: the median ratio to chat is the figure.

Run: ``.venv/bin/python -m bench.dialect_cpu [--rounds 5] [--seconds 1.5] [--streams no yes]``
(Postgres on 127.0.0.1:5432 as for ``bench.dialects``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import uvloop

from bench import peers
from bench.dialects import BODIES, payload
from bench.harness import Server, throwaway_database
from bench.loadgen import run_load


async def cpu_per_call(proxy: Server, body: bytes, concurrency: int, seconds: float) -> float:
    """Microseconds of the proxy's CPU per call over one batch."""
    before = proxy.cpu_s()
    result = await run_load("127.0.0.1", proxy.port, body, concurrency=concurrency, duration_s=seconds, warmup_s=0.0)
    if result.errors:
        raise RuntimeError(f"{result.errors} errors: {result.error_examples}")
    return (proxy.cpu_s() - before) / max(1, result.total_done) * 1e6


async def run(args: argparse.Namespace) -> None:
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-bench-dialect-cpu-"))
    with throwaway_database(args.db_admin) as db_url:
        stub = peers.stub(logdir, None)
        proxy = peers.onthejob(stub.url, db_url, logdir / "spool", logdir, None, record=True, name="onthejob-rec")
        try:
            for stream in args.streams:
                bodies = {d: payload(proxy.port, d, stream, args.max_tokens) for d in args.dialects}
                for body in bodies.values():
                    await cpu_per_call(proxy, body, args.concurrency, args.warmup)
                per: dict[str, list[float]] = {d: [] for d in args.dialects}
                for i in range(args.rounds):
                    for dialect in args.dialects if i % 2 == 0 else args.dialects[::-1]:
                        per[dialect].append(await cpu_per_call(proxy, bodies[dialect], args.concurrency, args.seconds))
                kind = "streaming" if stream else "non-streaming"
                print(f"{kind}, concurrency {args.concurrency}, {args.rounds} rounds:")
                for dialect, values in per.items():
                    ratios = [v / c for v, c in zip(values, per["chat"], strict=True)]
                    rounds = ", ".join(f"{r:.2f}" for r in ratios)
                    print(
                        f"  {dialect:10s} {statistics.median(values):6.0f} us/call  "
                        f"÷ chat {statistics.median(ratios):.3f}  (rounds: {rounds})",
                        flush=True,
                    )
        finally:
            proxy.stop()
            stub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialects", nargs="+", default=list(BODIES), choices=list(BODIES))
    parser.add_argument("--streams", nargs="+", default=["no", "yes"], choices=["no", "yes"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5, help="seconds per batch")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of each dialect before measuring")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--db-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if "chat" not in args.dialects:
        parser.error("--dialects must include chat (the baseline)")
    args.dialects = ["chat", *(d for d in args.dialects if d != "chat")]
    args.streams = [s == "yes" for s in args.streams]
    uvloop.run(run(args))


if __name__ == "__main__":
    main()
