"""What the recording proxy costs, in one run: direct vs bare pass-through vs onthejob (recording on and off).

Against the fast stub upstream (bench/stub_upstream.py, which returns token ids
and logprobs when asked), at concurrency 1 and 64, streaming and not. Prints p50/p99
added latency over direct, requests/s, the recording-on/off throughput ratio, and
records lost: every ``x-request-id`` a client got from the recording proxy, compared
with the rows in Postgres once the spool has drained (must be 0).

Run: ``.venv/bin/python -m bench.proxy_overhead`` (Postgres on 127.0.0.1:5432, user
postgres, trust auth; a throwaway database is created and dropped). ``--help`` for knobs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson
import uvloop

from bench import peers
from bench.harness import (
    Server,
    count_rows,
    fsync_probe,
    machine_description,
    pin_self,
    rotated,
    throwaway_database,
    wait_spool_empty,
)
from bench.loadgen import build_request
from bench.measure import Row, add_baseline, best_of, capacity, fmt, measure, table

PEERS = ("direct", "passthrough", "recording-on", "recording-off")


def payload(port: int, stream: bool, max_tokens: int) -> bytes:
    body = {
        "model": peers.MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return build_request("127.0.0.1", port, "/v1/chat/completions", orjson.dumps(body))


async def run(args: argparse.Namespace) -> int:
    load_cores, peer_cores = ({0}, {1}) if args.pin else (None, None)
    pin_self(load_cores)
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-bench-"))
    print(f"machine: {machine_description()}")
    fs50, fs99 = fsync_probe(logdir)
    print(f"one append+fsync on this disk now: p50 {fs50:.2f} ms, p99 {fs99:.2f} ms")
    print(
        f"CPU split: {'loadgen+stub on core 0, peer under test on core 1' if args.pin else 'unpinned'}; "
        f"logs and spools in {logdir}"
    )
    servers: dict[str, Server] = {}
    with throwaway_database(args.db_admin) as db_url:
        try:
            stub = servers["stub"] = peers.stub(logdir, load_cores)
            servers["passthrough"] = peers.passthrough(stub.url, logdir, peer_cores, client=args.bare_client)
            servers["recording-on"] = peers.onthejob(
                stub.url, db_url, logdir / "spool-on", logdir, peer_cores, record=True, name="onthejob-rec"
            )
            servers["recording-off"] = peers.onthejob(
                stub.url, db_url, logdir / "spool-off", logdir, peer_cores, record=False, name="onthejob-norec"
            )
            rows: list[Row] = []
            returned: list[str] = []
            for i in range(args.rounds):
                peers_now = rotated(PEERS, i)  # with --rounds a multiple of 4, each peer takes each slot
                for stream in (False, True):
                    for conc in (1, 64):
                        for peer in peers_now:
                            server = servers.get(peer)
                            port = stub.port if peer == "direct" else servers[peer].port
                            row = await measure(
                                peer,
                                server,
                                stub,
                                port,
                                payload(port, stream, args.max_tokens),
                                stream=stream,
                                concurrency=conc,
                                duration_s=args.duration,
                                warmup_s=args.warmup,
                            )
                            rows.append(row)
                            if peer == "recording-on":
                                returned += row.result.all_ids
                            print(
                                f"  {peer:14s} stream={stream!s:5s} c={conc:<3d} {row.rps:8,.0f} req/s  "
                                f"p50 {row.p50_ms:7.3f} ms  p99 {row.p99_ms:7.3f} ms  errors {row.errors}",
                                flush=True,
                            )
            waited = wait_spool_empty(servers["recording-on"].url)
            answered = sum(r.result.total_done for r in rows if r.peer == "recording-on")
            unique = set(returned)
            landed = count_rows(db_url, list(unique))
        finally:
            for server in servers.values():
                server.stop()
    rows = best_of(rows)
    add_baseline(rows)
    print()
    print(table(rows))
    print()
    return summarise(rows, answered, len(returned), len(unique), landed, waited)


def summarise(rows: list[Row], answered: int, ids: int, unique: int, landed: int, waited: float) -> int:
    def get(peer: str, stream: bool, conc: int) -> Row:
        return next(r for r in rows if (r.peer, r.stream, r.concurrency) == (peer, stream, conc))

    lost = unique - landed
    missing_ids = answered - ids
    print(
        f"recording-on: {answered} responses, {ids} x-request-ids ({unique} distinct), {landed} rows in Postgres "
        f"after the spool drained ({waited:.1f} s) -> records lost: {lost}"
        + (f"; {missing_ids} responses without an id!" if missing_ids else "")
    )
    for stream in (False, True):
        on, off = get("recording-on", stream, 64), get("recording-off", stream, 64)
        print(
            f"recording-on / recording-off throughput at 64, {'streaming' if stream else 'non-streaming'}: "
            f"{on.rps:,.0f} / {off.rps:,.0f} = {on.rps / off.rps:.2f}; by CPU cost per request: "
            f"{capacity(on):,.0f} / {capacity(off):,.0f} req/s per core = "
            f"{capacity(on) / capacity(off):.2f}"
        )
    direct64 = get("direct", False, 64)
    best_peer = max(r.rps for r in rows if r.peer != "direct" and not r.stream and r.concurrency == 64)
    print(
        f"load generator headroom: direct does {direct64.rps:,.0f} req/s at 64 (non-streaming) vs the fastest "
        f"peer's {best_peer:,.0f}"
    )
    on1, on64, off64 = get("recording-on", False, 1), get("recording-on", False, 64), get("recording-off", False, 64)
    pt64 = get("passthrough", False, 64)
    on1s = get("recording-on", True, 1)
    checks = [
        (
            "added p50 <= 1 ms at concurrency 1 (non-streaming)",
            on1.added_p50_ms <= 1.0,
            f"{fmt(on1.added_p50_ms, 3)} ms",
        ),
        ("added p50 <= 1 ms at concurrency 1 (streaming)", on1s.added_p50_ms <= 1.0, f"{fmt(on1s.added_p50_ms, 3)} ms"),
        (
            ">= 3,000 req/s at 64 with recording on (non-streaming)",
            on64.rps >= 3000,
            f"{on64.rps:,.0f} req/s (its CPU cost allows {capacity(on64):,.0f} req/s on one whole core)",
        ),
        (
            "recording-on >= 0.8x recording-off (non-streaming, 64)",
            on64.rps >= 0.8 * off64.rps,
            f"{on64.rps / off64.rps:.2f}x (by CPU cost per request: {capacity(on64) / capacity(off64):.2f}x)",
        ),
        (
            "recording-on >= 0.7x the bare pass-through (non-streaming, 64)",
            on64.rps >= 0.7 * pt64.rps,
            f"{on64.rps / pt64.rps:.2f}x (by CPU cost per request: {capacity(on64) / capacity(pt64):.2f}x)",
        ),
        ("0 records lost", lost == 0 and missing_ids == 0, str(lost)),
    ]
    print()
    for name, ok, value in checks:
        print(f"  [{'met' if ok and not _nan(value) else 'MISSED'}] {name}: {value}")
    return 0 if lost == 0 else 1


def _nan(value: str) -> bool:
    return value.startswith("—") or "nan" in value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds measured per configuration")
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="measure each configuration this often (a multiple of 4: each peer takes each slot); keep the best",
    )
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before measuring")
    parser.add_argument(
        "--bare-client",
        choices=("aiohttp", "ours"),
        default="aiohttp",
        help="the bare pass-through's upstream client: aiohttp (the reference) or the proxy's own",
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (= chunks per stream)")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin processes to cores")
    parser.add_argument("--db-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    t0 = time.monotonic()
    code = uvloop.run(run(args))
    print(f"\n(total {time.monotonic() - t0:.0f} s)")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
