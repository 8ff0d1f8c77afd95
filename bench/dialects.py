"""What a dialect costs over chat completions, in one run: the same recording proxy, the same stub engine.

Each dialect (the Responses API, Anthropic Messages, any other in ``BODIES``) is translated at the edge
into the chat call the engine gets, and its reply or stream back; this measures that
translation's price beside plain chat through the same recording proxy: added p50
over the stub alone at concurrency 1, and requests/s at 64, streaming and not. The
stub upstream is used for overhead measurement only (it answers in microseconds).

Run: ``.venv/bin/python -m bench.dialects`` (Postgres on 127.0.0.1:5432, user postgres,
trust auth; a throwaway database is created and dropped). ``--help`` for knobs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench import peers
from bench.harness import Server, machine_description, pin_self, throwaway_database
from bench.loadgen import build_request
from bench.measure import Row, add_baseline, best_of, fmt, measure, table

# The same question in each API the proxy speaks: (path, body).
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": peers.MODEL, "messages": [{"role": "user", "content": "Say hello."}]}),
    "responses": ("/v1/responses", {"model": peers.MODEL, "input": "Say hello."}),
    "anthropic": ("/v1/messages", {"model": peers.MODEL, "messages": [{"role": "user", "content": "Say hello."}]}),
}
LIMIT = {"chat": "max_tokens", "responses": "max_output_tokens"}


def payload(port: int, dialect: str, stream: bool, max_tokens: int) -> bytes:
    path, body = BODIES[dialect]
    body = {**body, LIMIT.get(dialect, "max_tokens"): max_tokens, "stream": stream}
    return build_request("127.0.0.1", port, path, orjson.dumps(body))


async def run(args: argparse.Namespace) -> int:
    load_cores, peer_cores = ({0}, {1}) if args.pin else (None, None)
    pin_self(load_cores)
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-bench-dialects-"))
    print(f"machine: {machine_description()}")
    servers: dict[str, Server] = {}
    rows: list[Row] = []
    with throwaway_database(args.db_admin) as db_url:
        try:
            stub = servers["stub"] = peers.stub(logdir, load_cores)
            proxy = servers["proxy"] = peers.onthejob(stub.url, db_url, logdir / "spool", logdir, peer_cores,
                                                      record=True, name="onthejob-rec")  # fmt: skip
            for _ in range(args.rounds):
                for stream in (False, True):
                    for conc in (1, 64):
                        direct = stub.port, payload(stub.port, "chat", stream, args.max_tokens)
                        configs = [("direct", None, *direct)] + [
                            (dialect, proxy, proxy.port, payload(proxy.port, dialect, stream, args.max_tokens))
                            for dialect in args.dialects
                        ]
                        for name, server, port, body in configs:
                            row = await measure(name, server, stub, port, body, stream=stream, concurrency=conc,
                                                duration_s=args.duration, warmup_s=args.warmup)  # fmt: skip
                            rows.append(row)
                            print(f"  {name:10s} stream={stream!s:5s} c={conc:<3d} {row.rps:8,.0f} req/s  "
                                  f"p50 {row.p50_ms:7.3f} ms  errors {row.errors}", flush=True)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
    rows = best_of(rows)
    add_baseline(rows)
    print()
    print(table(rows))
    print()
    return summarise(rows, args.dialects)


def summarise(rows: list[Row], dialects: list[str]) -> int:
    def get(peer: str, stream: bool, conc: int) -> Row:
        return next(r for r in rows if (r.peer, r.stream, r.concurrency) == (peer, stream, conc))

    missed = 0
    for dialect in (d for d in dialects if d != "chat"):
        for stream in (False, True):
            kind = "streaming" if stream else "non-streaming"
            chat1, ours1 = get("chat", stream, 1), get(dialect, stream, 1)
            chat64, ours64 = get("chat", stream, 64), get(dialect, stream, 64)
            extra = ours1.added_p50_ms - chat1.added_p50_ms
            ratio = ours64.rps / chat64.rps
            errors = sum(get(dialect, stream, c).errors for c in (1, 64))
            checks = [
                (f"{dialect} added p50 at 1 within 0.2 ms of chat ({kind})", extra <= 0.2,
                 f"{fmt(ours1.added_p50_ms, 3)} vs {fmt(chat1.added_p50_ms, 3)} ms: {extra:+.3f} ms"),
                (f"{dialect} req/s at 64 within 15% of chat ({kind})", ratio >= 0.85,
                 f"{ours64.rps:,.0f} vs {chat64.rps:,.0f} req/s: {ratio:.2f}x"),
                (f"{dialect} answered without errors ({kind})", errors == 0, str(errors)),
            ]  # fmt: skip
            for name, ok, value in checks:
                missed += not ok
                print(f"  [{'met' if ok else 'MISSED'}] {name}: {value}")
    return 0 if missed == 0 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialects", nargs="+", default=list(BODIES), choices=list(BODIES))
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per configuration")
    parser.add_argument("--rounds", type=int, default=2, help="measure each configuration this often; keep the best")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before measuring")
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
