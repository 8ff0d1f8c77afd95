"""One measured configuration (peer × streaming × concurrency) and the tables made from many."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import CLK, Server, self_cpu_s
from bench.loadgen import LoadResult, pct, run_load


@dataclass
class Row:
    peer: str
    stream: bool
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    ttfb_p50_ms: float  # first SSE data event (streaming only)
    cpu_per_1k_s: float  # the peer's own CPU seconds per 1,000 requests (workers included)
    wall_s: float  # how long the run really took (the last replies may end after the window)
    loadgen_cores: float  # cores the load generator used during the run
    other_cores: float  # cores busy with anything but loadgen, stub and peer (Postgres, other people's work)
    errors: int
    result: LoadResult = field(repr=False)
    added_p50_ms: float = math.nan
    added_p99_ms: float = math.nan
    added_ttfb_ms: float = math.nan


def _busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / CLK


async def measure(
    peer: str,
    server: Server | None,
    stub: Server,
    port: int,
    payload: bytes,
    *,
    stream: bool,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    want_events: bool = False,
    marker: bytes | None = None,
) -> Row:
    """Run one configuration against ``port`` and account for everyone's CPU while it ran."""
    cpu0, stub0, me0, busy0 = server.cpu_s() if server else 0.0, stub.cpu_s(), self_cpu_s(), _busy_s()
    t0 = time.perf_counter()
    result = await run_load(
        "127.0.0.1",
        port,
        payload,
        concurrency=concurrency,
        duration_s=duration_s,
        warmup_s=warmup_s,
        want_events=want_events,
        marker=marker,
    )
    wall = time.perf_counter() - t0  # longer than warm-up + duration when the last replies were slow
    cpu = (server.cpu_s() - cpu0) if server else 0.0
    me, stub_cpu, busy = self_cpu_s() - me0, stub.cpu_s() - stub0, _busy_s() - busy0
    done = max(1, result.total_done)
    lat = result.latencies_ms()
    return Row(
        peer=peer,
        stream=stream,
        concurrency=concurrency,
        rps=result.rps,
        p50_ms=pct(lat, 50),
        p99_ms=pct(lat, 99),
        ttfb_p50_ms=pct(result.ttfb_ms(), 50) if stream else math.nan,
        cpu_per_1k_s=cpu / done * 1000 if server else math.nan,
        wall_s=wall,
        loadgen_cores=me / wall,
        other_cores=max(0.0, (busy - me - stub_cpu - cpu) / wall),
        errors=result.errors,
        result=result,
    )


def add_baseline(rows: list[Row], baseline: str = "direct") -> None:
    """Fill the added-latency columns: each peer's percentile minus direct's at the same stream/concurrency."""
    base = {(r.stream, r.concurrency): r for r in rows if r.peer == baseline}
    for r in rows:
        b = base.get((r.stream, r.concurrency))
        if b is None:
            continue
        r.added_p50_ms = r.p50_ms - b.p50_ms
        r.added_p99_ms = r.p99_ms - b.p99_ms
        if r.stream:
            r.added_ttfb_ms = r.ttfb_p50_ms - b.ttfb_p50_ms


def fmt(x: float, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def table(rows: list[Row]) -> str:
    """A markdown table of every row."""
    head = (
        "| peer | stream | conc | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | added TTFB ms "
        "| peer CPU s/1k req | req/s per peer core | loadgen cores | other load (cores) | errors |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.peer} | {'yes' if r.stream else 'no'} | {r.concurrency} | {fmt(r.rps, 0)} | {fmt(r.p50_ms, 3)} "
            f"| {fmt(r.p99_ms, 3)} | {fmt(r.added_p50_ms, 3)} | {fmt(r.added_p99_ms, 3)} | {fmt(r.added_ttfb_ms, 3)} "
            f"| {fmt(r.cpu_per_1k_s, 3)} | {fmt(capacity(r), 0)} "
            f"| {fmt(r.loadgen_cores)} | {fmt(r.other_cores)} | {r.errors} |"
        )
    return "\n".join(lines)


def best_of(rows: list[Row]) -> list[Row]:
    """Per peer/stream/concurrency, the round with the most requests/s (others' work only slows a run down)."""
    keep: dict[tuple[str, bool, int], Row] = {}
    for r in rows:
        key = (r.peer, r.stream, r.concurrency)
        if key not in keep or r.rps > keep[key].rps:
            keep[key] = r
    return list(keep.values())


def capacity(row: Row | None) -> float:
    """Requests/s one core could serve at this row's CPU cost (robust to neighbours' load; NaN for direct)."""
    if row is None or not row.cpu_per_1k_s or math.isnan(row.cpu_per_1k_s):
        return math.nan
    return 1000 / row.cpu_per_1k_s
