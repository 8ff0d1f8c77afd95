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
from bench.harness import Server, machine_description, pin_self, rotated, throwaway_database
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
            for i in range(args.rounds):
                for stream in (False, True):
                    for conc in (1, 64):
                        direct = stub.port, payload(stub.port, "chat", stream, args.max_tokens)
                        configs = [("direct", None, *direct)] + [
                            (dialect, proxy, proxy.port, payload(proxy.port, dialect, stream, args.max_tokens))
                            for dialect in args.dialects
                        ]
                        for name, server, port, body in rotated(configs, i):
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


def translation_cpu(dialects: list[str], max_tokens: int, calls: int = 5000) -> None:
    """CPU per call of the edge translation alone (no server, no network): robust on a loaded machine.

    Chat's own work on the same reply (strip and serialise each chunk) is the baseline the
    dialect replaces; the difference is what the translation adds to a call.
    """
    from proxy import capture
    from proxy.dialects import ROUTES
    from proxy.dialects.base import Exchange, StreamEnd

    usage = {"prompt_tokens": 16, "completion_tokens": max_tokens, "total_tokens": 16 + max_tokens}
    choice = {"index": 0, "message": {"role": "assistant", "content": "x" * max_tokens}, "finish_reason": "length",
              "stop_reason": None, "token_ids": list(range(max_tokens))}  # fmt: skip
    reply = {"id": "c", "object": "chat.completion", "model": peers.MODEL, "choices": [choice], "usage": usage}
    head = {"id": "c", "object": "chat.completion.chunk", "model": peers.MODEL}
    chunks = [{**head, "prompt_token_ids": list(range(16)),
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]  # fmt: skip
    chunks += [{**head, "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [i],
                                     "logprobs": {"content": [{"token": "x", "logprob": -0.5}]}}]}
               for i in range(max_tokens)]  # fmt: skip
    chunks += [{**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
               {**head, "choices": [], "usage": usage}]  # fmt: skip

    def cpu_us(fn: Any) -> float:
        start = time.process_time()
        for _ in range(calls):
            fn()
        return (time.process_time() - start) / calls * 1e6

    plain, streamed = capture.Wants(False, False, False, False), capture.Wants(False, False, False, True)
    base = cpu_us(lambda: orjson.dumps(capture.strip({**reply, "choices": [dict(choice)]}, plain, peers.MODEL)))
    base_stream = cpu_us(lambda: [orjson.dumps(capture.strip(dict(c), streamed, peers.MODEL)) for c in chunks])
    print(f"chat (baseline): non-streamed {base:.1f} us, {max_tokens}-token stream {base_stream:.1f} us")
    for name in (d for d in dialects if d != "chat"):
        path, body = BODIES[name]
        body = {**body, LIMIT.get(name, "max_tokens"): max_tokens}
        dialect = ROUTES[path]
        ex = Exchange(dialect.new_id(), peers.MODEL, 0, body, dialect.to_chat(body, None))

        def whole(dialect: Any = dialect, body: dict[str, Any] = body, ex: Exchange = ex) -> bytes:
            dialect.to_chat(body, None)
            return orjson.dumps(dialect.reply({**reply, "choices": [dict(choice)]}, ex))

        def stream(dialect: Any = dialect, body: dict[str, Any] = body, ex: Exchange = ex) -> bytes:
            dialect.to_chat(body, None)
            events = dialect.stream(ex)
            out = events.open() + b"".join(events.feed(c) for c in chunks)
            return out + events.close(StreamEnd("length", usage))

        one, many = cpu_us(whole), cpu_us(stream)
        print(f"{name}: non-streamed {one:.1f} us ({one - base:+.1f} over chat), "
              f"{max_tokens}-token stream {many:.1f} us ({many - base_stream:+.1f} over chat)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialects", nargs="+", default=list(BODIES), choices=list(BODIES))
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per configuration")
    parser.add_argument("--rounds", type=int, default=2, help="measure each configuration this often; keep the best")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before measuring")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (= chunks per stream)")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin processes to cores")
    parser.add_argument("--db-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--translation-only", action="store_true",
                        help="CPU per call of each dialect's translation alone (no servers)")  # fmt: skip
    args = parser.parse_args()
    if args.translation_only:
        translation_cpu(args.dialects, args.max_tokens)
        return
    t0 = time.monotonic()
    code = uvloop.run(run(args))
    print(f"\n(total {time.monotonic() - t0:.0f} s)")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
