"""onthejob side by side with direct, a bare pass-through and LiteLLM's proxy, in one run, one table.

Peers, all in front of the same stub upstream and driven by the same load generator:
direct to the stub; the bare pass-through (bench/passthrough.py: Starlette + aiohttp,
nothing recorded); onthejob recording to Postgres (and with recording off, for the
on/off ratio); LiteLLM's proxy (its own venv, bench/.litellm-venv, created on first
use; no database: its Prisma layer needs a download the package registries do not
serve). Non-streaming and streaming at concurrency 1, 16 and 64; streaming fidelity
with a 20 ms gap between chunks; records lost; and the spool → Postgres drain rate,
measured apart with the proxy's own Recorder on a spool filled while the database
was unreachable.

Run: ``.venv/bin/python -m bench.compare_proxies [--out bench/results-compare.md]``
(Postgres on 127.0.0.1:5432, user postgres, trust auth). ``--help`` for knobs.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import uvloop

from bench import peers
from bench.harness import (
    PY,
    Server,
    fsync_probe,
    machine_description,
    pin_self,
    rotated,
    throwaway_database,
    wait_rows,
)
from bench.loadgen import build_request, pct
from bench.measure import Row, add_baseline, best_of, capacity, fmt, measure, table
from proxy.policies import Policies

UNREACHABLE_DB = "postgresql://postgres@127.0.0.1:1/unreachable"


@dataclass
class Fidelity:
    peer: str
    gaps: int
    mean_gap_ms: float
    p50_dev_ms: float
    p99_dev_ms: float
    ttfb_p50_ms: float
    added_ttfb_ms: float = math.nan


def body(port: int, stream: bool, max_tokens: int, gap_ms: float = 0) -> bytes:
    obj: dict[str, object] = {
        "model": peers.MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if gap_ms:
        obj["stub_gap_ms"] = gap_ms  # the stub's knob; every peer here passes unknown fields through
    return build_request("127.0.0.1", port, "/v1/chat/completions", orjson.dumps(obj))


async def run(args: argparse.Namespace) -> str:
    if args.workers > 1:
        args.pin = False  # several workers per peer: they, the stub and the load share every core
    load_cores, peer_cores = ({0}, {1}) if args.pin else (None, None)
    pin_self(load_cores)
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-compare-"))
    out: list[str] = [f"machine: {machine_description()}"]
    split = "load generator + stub on core 0, peer under test on core 1" if args.pin else "unpinned"
    litellm_workers = args.litellm_workers or args.workers
    out.append(
        f"CPU split: {split}; workers per peer: onthejob {args.workers}, pass-through {args.workers}, "
        f"LiteLLM {litellm_workers}"
    )
    out.append("versions: " + ", ".join(f"{k} {v}" for k, v in peers.versions().items()))
    fs50, fs99 = fsync_probe(logdir)
    out.append(f"one append+fsync on this disk now: p50 {fs50:.2f} ms, p99 {fs99:.2f} ms")
    print("\n".join(out), flush=True)
    servers: dict[str, Server] = {}
    rows: list[Row] = []
    fidelity: list[Fidelity] = []
    with throwaway_database(args.db_admin) as db_url:
        try:
            stub = servers["stub"] = peers.stub(logdir, load_cores)
            w = args.workers
            servers["passthrough"] = peers.passthrough(stub.url, logdir, peer_cores, workers=w)
            servers["onthejob"] = peers.onthejob(
                stub.url, db_url, logdir / "spool-on", logdir, peer_cores, record=True, name="onthejob", workers=w
            )
            servers["onthejob-rec-off"] = peers.onthejob(
                stub.url,
                db_url,
                logdir / "spool-off",
                logdir,
                peer_cores,
                record=False,
                name="onthejob-rec-off",
                workers=w,
            )
            if not args.skip_litellm:
                servers["litellm"] = peers.litellm(stub.url, logdir, peer_cores, workers=litellm_workers)
            order = ["direct", "passthrough", "onthejob", "onthejob-rec-off", "litellm"]
            order = [p for p in order if p == "direct" or p in servers]
            returned: list[str] = []
            for i in range(args.rounds):
                for stream in (False, True):
                    for conc in args.concurrency:
                        for peer in rotated(order, i):
                            server = servers.get(peer) if peer != "direct" else None
                            port = stub.port if server is None else server.port
                            row = await measure(
                                peer,
                                server,
                                stub,
                                port,
                                body(port, stream, args.max_tokens),
                                stream=stream,
                                concurrency=conc,
                                duration_s=args.duration,
                                warmup_s=args.warmup,
                            )
                            rows.append(row)
                            if peer == "onthejob":
                                returned += row.result.all_ids
                            print(
                                f"  {peer:16s} stream={stream!s:5s} c={conc:<3d} {row.rps:8,.0f} req/s  "
                                f"p50 {row.p50_ms:8.3f} ms  p99 {row.p99_ms:8.3f} ms  errors {row.errors}",
                                flush=True,
                            )
            for peer in order:
                server = servers.get(peer) if peer != "direct" else None
                port = stub.port if server is None else server.port
                row = await measure(
                    peer,
                    server,
                    stub,
                    port,
                    body(port, True, args.gap_tokens, args.gap_ms),
                    stream=True,
                    concurrency=args.gap_concurrency,
                    duration_s=args.gap_duration,
                    warmup_s=args.warmup,
                    want_events=True,
                    marker=b'"x"',
                )
                if peer == "onthejob":
                    returned += row.result.all_ids
                gaps = row.result.gaps_ms()
                devs = [abs(g - args.gap_ms) for g in gaps]
                fidelity.append(
                    Fidelity(
                        peer, len(gaps), sum(gaps) / max(1, len(gaps)), pct(devs, 50), pct(devs, 99), row.ttfb_p50_ms
                    )
                )
                print(
                    f"  fidelity {peer:16s} {len(gaps)} gaps, p99 |gap-{args.gap_ms:g}| {pct(devs, 99):.3f} ms, "
                    f"first chunk p50 {row.ttfb_p50_ms:.3f} ms",
                    flush=True,
                )
            unique = set(returned)
            landed = wait_rows(db_url, list(unique))
        finally:
            for server in servers.values():
                server.stop()
        drained = await drain_rate(db_url, logdir, peer_cores, args.drain_seconds)
    rows = best_of(rows)
    add_baseline(rows)
    base_ttfb = next(f.ttfb_p50_ms for f in fidelity if f.peer == "direct")
    for f in fidelity:
        f.added_ttfb_ms = f.ttfb_p50_ms - base_ttfb
    out += ["", "## Throughput and added latency", "", table(rows), ""]
    out += [
        "## Streaming fidelity",
        "",
        f"stub gap {args.gap_ms:g} ms, {args.gap_tokens} tokens a stream, concurrency {args.gap_concurrency}, "
        f"{args.gap_duration:g} s per peer; gaps between token-bearing chunks as the client received them; "
        "first chunk = the first SSE data event",
        "",
        "| peer | gaps | mean gap ms | p50 \\|gap − sent\\| ms | p99 \\|gap − sent\\| ms | first chunk p50 ms "
        "| added first chunk ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in fidelity:
        out.append(
            f"| {f.peer} | {f.gaps} | {fmt(f.mean_gap_ms, 3)} | {fmt(f.p50_dev_ms, 3)} | {fmt(f.p99_dev_ms, 3)} "
            f"| {fmt(f.ttfb_p50_ms, 3)} | {fmt(f.added_ttfb_ms, 3)} |"
        )
    lost = len(unique) - landed
    out += [
        "",
        "## Recording",
        "",
        f"- onthejob returned {len(returned)} x-request-ids ({len(unique)} distinct); {landed} rows in Postgres "
        f"after the spool drained -> **records lost: {lost}**",
        f"- drain rate (spool → Postgres, the proxy's Recorder alone, pinned like the proxy): "
        f"{drained['records']:,.0f} records, {drained['bytes'] / max(1, drained['records']):,.0f} bytes mean, in "
        f"{drained['seconds']:.2f} s = **{drained['records_per_s']:,.0f} records/s**",
    ]
    out += ["", "## Targets (ratios from this run)", ""] + targets(rows, fidelity, lost, drained["records_per_s"])
    return "\n".join(out)


async def drain_rate(db_url: str, logdir: Path, cores: set[int] | None, seconds: float) -> dict[str, float]:
    """Fill a spool through the proxy with its database unreachable, then time draining it for real."""
    spool = logdir / "spool-drain"
    # With its database unreachable from the start, a proxy records only for projects whose redaction policy
    # it last saw (proxy/policies.py; else 503, nothing spooled): leave what one that had seen it would.
    Policies(spool).update({"default": None})
    stub = peers.stub(logdir, None)
    proxy = peers.onthejob(stub.url, UNREACHABLE_DB, spool, logdir, cores, record=True, name="onthejob-fill")
    try:
        half = seconds / 2
        for stream in (False, True):
            await _fill(proxy.port, body(proxy.port, stream, 16), half)
    finally:
        proxy.stop()
        stub.stop()
    cmd = [PY, "-m", "bench.drain", "--spool", str(spool), "--db", db_url]
    pre = None
    if cores is not None:
        import os

        def pre() -> None:
            os.sched_setaffinity(0, cores)

    done = subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=pre)  # noqa: PLW1509
    return orjson.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def _fill(port: int, payload: bytes, seconds: float) -> None:
    from bench.loadgen import run_load

    await run_load("127.0.0.1", port, payload, concurrency=32, duration_s=seconds, warmup_s=0)


def by_cpu(a: Row, b: Row) -> str:
    """The same ratio from CPU cost per request, which neighbours' load on the shared cores disturbs less."""
    return f" (by CPU cost per request: {capacity(a):,.0f} / {capacity(b):,.0f} = {capacity(a) / capacity(b):.2f}x)"


def targets(rows: list[Row], fidelity: list[Fidelity], lost: int, drain_rps: float) -> list[str]:
    def get(peer: str, stream: bool, conc: int) -> Row | None:
        return next((r for r in rows if (r.peer, r.stream, r.concurrency) == (peer, stream, conc)), None)

    def line(name: str, ok: bool, value: str) -> str:
        return f"- [{'met' if ok else 'MISSED'}] {name}: {value}"

    on1, on64 = get("onthejob", False, 1), get("onthejob", False, 64)
    off64, pass64, ll64 = get("onthejob-rec-off", False, 64), get("passthrough", False, 64), get("litellm", False, 64)
    fid = next(f for f in fidelity if f.peer == "onthejob")
    out = []
    if on1:
        out.append(line("added p50 <= 1 ms at concurrency 1", on1.added_p50_ms <= 1, f"{fmt(on1.added_p50_ms, 3)} ms"))
    if on64 and ll64:
        ratio = on64.rps / ll64.rps
        out.append(
            line(
                "req/s at 64 >= 20x LiteLLM's",
                ratio >= 20,
                f"{on64.rps:,.0f} / {ll64.rps:,.0f} = {ratio:.1f}x{by_cpu(on64, ll64)}",
            )
        )
    if on64 and pass64:
        ratio = on64.rps / pass64.rps
        out.append(
            line(
                "req/s at 64 >= 0.5x the bare pass-through's",
                ratio >= 0.5,
                f"{on64.rps:,.0f} / {pass64.rps:,.0f} = {ratio:.2f}x{by_cpu(on64, pass64)}",
            )
        )
    if on64 and off64:
        ratio = on64.rps / off64.rps
        out.append(
            line(
                "recording-on >= 0.8x recording-off (64)",
                ratio >= 0.8,
                f"{on64.rps:,.0f} / {off64.rps:,.0f} = {ratio:.2f}x{by_cpu(on64, off64)}",
            )
        )
    out.append(line("streaming gap deviation p99 <= 2 ms", fid.p99_dev_ms <= 2, f"{fmt(fid.p99_dev_ms, 3)} ms"))
    out.append(line("time to first chunk added <= 1 ms", fid.added_ttfb_ms <= 1, f"{fmt(fid.added_ttfb_ms, 3)} ms"))
    if on64:
        out.append(
            line(
                "drain rate >= 2x the proxy's sustained rate",
                drain_rps >= 2 * on64.rps,
                f"{drain_rps:,.0f} records/s vs 2 x {on64.rps:,.0f} req/s "
                f"(vs 2 x its CPU-bound capacity: {capacity(on64):,.0f} req/s per core)",
            )
        )
    out.append(line("0 records lost", lost == 0, str(lost)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per configuration")
    parser.add_argument("--rounds", type=int, default=2, help="measure each configuration this often; keep the best")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (= chunks per stream)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="stub's gap between streamed chunks (fidelity)")
    parser.add_argument("--gap-tokens", type=int, default=25)
    parser.add_argument("--gap-concurrency", type=int, default=8)
    parser.add_argument("--gap-duration", type=float, default=4.0)
    parser.add_argument("--drain-seconds", type=float, default=4.0, help="seconds of traffic to fill the spool")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes per peer (onthejob, pass-through, LiteLLM); > 1 turns pinning off",
    )
    parser.add_argument("--litellm-workers", type=int, default=0, help="LiteLLM's own count (default: --workers)")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument("--db-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    t0 = time.monotonic()
    report = uvloop.run(run(args))
    report += f"\n\n(total {time.monotonic() - t0:.0f} s)\n"
    print("\n" + report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
