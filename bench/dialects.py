"""What a dialect costs over chat completions, in one run: the same recording proxy, the same stub engine.

Each dialect (the Responses API, Anthropic Messages, Gemini, any other in ``BODIES``) is translated at the edge
into the chat call the engine gets, and its reply or stream back; this measures that
translation's price beside plain chat through the same recording proxy: added p50
over the stub alone at concurrency 1, and requests/s at 64, streaming and not, on short
bodies and on corpus-sized ones (a ~60 KB agent conversation with tools, as harnesses send);
medians of 3 alternating rounds by default. The stub upstream is used for overhead
measurement only (it answers in microseconds).

Run: ``.venv/bin/python -m bench.dialects`` (Postgres on 127.0.0.1:5432, user postgres,
trust auth; a throwaway database is created and dropped). ``--help`` for knobs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench import peers
from bench.harness import Server, machine_description, pin_self, rotated, throwaway_database
from bench.loadgen import build_request
from bench.measure import Row, add_baseline, best_of, fmt, measure, table

# The same question in each API the proxy speaks: (path, body).
GEMINI = f"/v1beta/models/{peers.MODEL}"
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": peers.MODEL, "messages": [{"role": "user", "content": "Say hello."}]}),
    "responses": ("/v1/responses", {"model": peers.MODEL, "input": "Say hello."}),
    "anthropic": ("/v1/messages", {"model": peers.MODEL, "messages": [{"role": "user", "content": "Say hello."}]}),
    "gemini": (f"{GEMINI}:generateContent", {"contents": [{"role": "user", "parts": [{"text": "Say hello."}]}]}),
}
LIMIT = {"chat": "max_tokens", "responses": "max_output_tokens"}
SIZES = ("short", "corpus")


def corpus_bodies(turns: int = 12) -> dict[str, dict[str, Any]]:
    """One harness-sized conversation (~60 KB, between Codex's ~41 KB and Claude Code's ~78 KB calls) per API.

    A long system prompt, eight function tools with schemas, and ``turns`` rounds of a user
    message, a tool call, its result and an answer: what each dialect parses and translates on
    every call of an agent loop, whatever the engine answers.
    """
    system = ("You are a coding agent working in a repository. Follow the conventions you find. " * 160).strip()
    schema = {
        "type": "object",
        "required": ["path"],
        "properties": {
            "path": {"type": "string", "description": "a path inside the repository"},
            "limit": {"type": "integer", "description": "how many lines at most"},
            "pattern": {"type": "string", "description": "a regular expression to look for"},
        },
    }
    tools = [(f"tool_{k}", "Reads, searches or edits files in the working tree. " * 8) for k in range(8)]
    rounds = [
        (
            f"Please look at module {k} and tell me what it does. " * 24,
            f"tool_{k % 8}",
            {"path": f"src/module_{k}.py", "limit": 200},
            f"line {k}: def handler(request): ...\n" * 40,
            f"Module {k} handles requests. " * 18,
        )
        for k in range(turns)
    ]
    last = "Now summarise what you found."
    chat: list[dict[str, Any]] = [{"role": "system", "content": system}]
    responses: list[dict[str, Any]] = []
    anthropic: list[dict[str, Any]] = []
    gemini: list[dict[str, Any]] = []
    for k, (ask, name, args, result, answer) in enumerate(rounds):
        call_id, arguments = f"call_{k}", orjson.dumps(args).decode()
        chat += [
            {"role": "user", "content": ask},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": answer},
        ]
        responses += [
            {"role": "user", "content": ask},
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id, "output": result},
            {"role": "assistant", "content": answer},
        ]
        anthropic += [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": args}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}]},
            {"role": "assistant", "content": answer},
        ]
        gemini += [
            {"role": "user", "parts": [{"text": ask}]},
            {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": name, "args": args}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"id": call_id, "name": name, "response": {"output": result}}}],
            },
            {"role": "model", "parts": [{"text": answer}]},
        ]
    chat.append({"role": "user", "content": last})
    responses.append({"role": "user", "content": last})
    anthropic.append({"role": "user", "content": last})
    gemini.append({"role": "user", "parts": [{"text": last}]})
    return {
        "chat": {
            "model": peers.MODEL,
            "messages": chat,
            "tools": [
                {"type": "function", "function": {"name": n, "description": d, "parameters": schema}} for n, d in tools
            ],
        },
        "responses": {
            "model": peers.MODEL,
            "instructions": system,
            "input": responses,
            "tools": [{"type": "function", "name": n, "description": d, "parameters": schema} for n, d in tools],
        },
        "anthropic": {
            "model": peers.MODEL,
            "system": system,
            "messages": anthropic,
            "tools": [{"name": n, "description": d, "input_schema": schema} for n, d in tools],
        },
        "gemini": {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": gemini,
            "tools": [
                {
                    "functionDeclarations": [
                        {"name": n, "description": d, "parametersJsonSchema": schema} for n, d in tools
                    ]
                }
            ],
        },
    }


def request_of(dialect: str, size: str, stream: bool, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of one call: the dialect's question, short or corpus-sized, streamed or not."""
    path, body = BODIES[dialect]
    if size == "corpus":
        body = corpus_bodies()[dialect]
    if dialect == "gemini":  # the mode is in the path, the output limit in generationConfig
        if stream:
            path = f"{GEMINI}:streamGenerateContent?alt=sse"
        return path, {**body, "generationConfig": {"maxOutputTokens": max_tokens}}
    return path, {**body, LIMIT.get(dialect, "max_tokens"): max_tokens, "stream": stream}


def payload(port: int, dialect: str, stream: bool, max_tokens: int, size: str = "short") -> bytes:
    path, body = request_of(dialect, size, stream, max_tokens)
    return build_request("127.0.0.1", port, path, orjson.dumps(body))


def median_of(rows: list[Row]) -> list[Row]:
    """Per peer/stream/concurrency, the median round: median requests/s and median latencies (odd rounds)."""
    groups: dict[tuple[str, bool, int], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.peer, r.stream, r.concurrency), []).append(r)
    out = []
    for group in groups.values():
        mid = len(group) // 2
        row = replace(sorted(group, key=lambda r: r.rps)[mid])
        row.p50_ms = sorted(r.p50_ms for r in group)[mid]
        row.p99_ms = sorted(r.p99_ms for r in group)[mid]
        row.ttfb_p50_ms = sorted(r.ttfb_p50_ms for r in group)[mid]
        row.errors = sum(r.errors for r in group)
        out.append(row)
    return out


async def run(args: argparse.Namespace) -> int:
    load_cores, peer_cores = ({0}, {1}) if args.pin else (None, None)
    pin_self(load_cores)
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-bench-dialects-"))
    print(f"machine: {machine_description()}")
    servers: dict[str, Server] = {}
    rows_by_size: dict[str, list[Row]] = {size: [] for size in args.sizes}
    with throwaway_database(args.db_admin) as db_url:
        try:
            stub = servers["stub"] = peers.stub(logdir, load_cores)
            proxy = servers["proxy"] = peers.onthejob(
                stub.url, db_url, logdir / "spool", logdir, peer_cores, record=True, name="onthejob-rec"
            )
            for i in range(args.rounds):  # alternating: every configuration once per round, in a rotated order
                for size in args.sizes:
                    for stream in (False, True):
                        for conc in (1, 64):
                            direct = stub.port, payload(stub.port, "chat", stream, args.max_tokens, size)
                            configs = [("direct", None, *direct)] + [
                                (
                                    dialect,
                                    proxy,
                                    proxy.port,
                                    payload(proxy.port, dialect, stream, args.max_tokens, size),
                                )
                                for dialect in args.dialects
                            ]
                            for name, server, port, body in rotated(configs, i):
                                row = await measure(
                                    name,
                                    server,
                                    stub,
                                    port,
                                    body,
                                    stream=stream,
                                    concurrency=conc,
                                    duration_s=args.duration,
                                    warmup_s=args.warmup,
                                )
                                rows_by_size[size].append(row)
                                print(
                                    f"  {size:6s} {name:10s} stream={stream!s:5s} c={conc:<3d} "
                                    f"{row.rps:8,.0f} req/s  p50 {row.p50_ms:7.3f} ms  errors {row.errors}",
                                    flush=True,
                                )
        finally:
            for server in servers.values():
                server.stop()
    missed = 0
    for size, rows in rows_by_size.items():
        rows = median_of(rows) if args.aggregate == "median" else best_of(rows)
        add_baseline(rows)
        print(
            f"\n{size} bodies ({len(orjson.dumps(request_of('chat', size, False, 1)[1])):,} bytes as chat), "
            f"{args.aggregate} of {args.rounds} rounds\n"
        )
        print(table(rows))
        print()
        missed += summarise(rows, args.dialects)
    return 0 if missed == 0 else 1


def summarise(rows: list[Row], dialects: list[str]) -> int:
    """Print each dialect's checks against chat; the number missed."""

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
                (
                    f"{dialect} added p50 at 1 within 0.2 ms of chat ({kind})",
                    extra <= 0.2,
                    f"{fmt(ours1.added_p50_ms, 3)} vs {fmt(chat1.added_p50_ms, 3)} ms: {extra:+.3f} ms",
                ),
                (
                    f"{dialect} req/s at 64 within 15% of chat ({kind})",
                    ratio >= 0.85,
                    f"{ours64.rps:,.0f} vs {chat64.rps:,.0f} req/s: {ratio:.2f}x",
                ),
                (f"{dialect} answered without errors ({kind})", errors == 0, str(errors)),
            ]
            for name, ok, value in checks:
                missed += not ok
                print(f"  [{'met' if ok else 'MISSED'}] {name}: {value}")
    return missed


def translation_cpu(dialects: list[str], max_tokens: int, calls: int = 5000) -> None:
    """CPU per call of the edge translation alone (no server, no network): robust on a loaded machine.

    Chat's own work on the same reply (strip and serialise each chunk) is the baseline the
    dialect replaces; the difference is what the translation adds to a call.
    """
    from proxy import capture
    from proxy.dialects import ROUTES
    from proxy.dialects.base import Exchange, StreamEnd
    from proxy.dialects.gemini import call_route as gemini_route

    usage = {"prompt_tokens": 16, "completion_tokens": max_tokens, "total_tokens": 16 + max_tokens}
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "x" * max_tokens},
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": list(range(max_tokens)),
    }
    reply = {"id": "c", "object": "chat.completion", "model": peers.MODEL, "choices": [choice], "usage": usage}
    head = {"id": "c", "object": "chat.completion.chunk", "model": peers.MODEL}
    chunks: list[dict[str, Any]] = [
        {
            **head,
            "prompt_token_ids": list(range(16)),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    ]
    chunks += [
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "x"},
                    "token_ids": [i],
                    "logprobs": {"content": [{"token": "x", "logprob": -0.5}]},
                }
            ],
        }
        for i in range(max_tokens)
    ]
    chunks += [
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {**head, "choices": [], "usage": usage},
    ]

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
        path, body = request_of(name, "short", False, max_tokens)
        body.pop("stream", None)
        dialect = ROUTES[path] if path in ROUTES else gemini_route(path, b"")[2]  # type: ignore[index]
        ex = Exchange(dialect.new_id(), peers.MODEL, 0, body, dialect.to_chat(body, None))

        def whole(dialect: Any = dialect, body: dict[str, Any] = body, ex: Exchange = ex) -> bytes:
            dialect.to_chat(body, None)
            return orjson.dumps(dialect.reply({**reply, "choices": [dict(choice)]}, ex))

        def stream(dialect: Any = dialect, body: dict[str, Any] = body, ex: Exchange = ex) -> bytes:
            dialect.to_chat(body, None)
            events = dialect.stream(ex)
            out = events.open() + b"".join(events.feed(c) for c in chunks)
            return bytes(out + events.close(StreamEnd("length", usage)))

        one, many = cpu_us(whole), cpu_us(stream)
        print(
            f"{name}: non-streamed {one:.1f} us ({one - base:+.1f} over chat), "
            f"{max_tokens}-token stream {many:.1f} us ({many - base_stream:+.1f} over chat)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialects", nargs="+", default=list(BODIES), choices=list(BODIES))
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per configuration")
    parser.add_argument("--rounds", type=int, default=3, help="measure each configuration this often, alternating")
    parser.add_argument(
        "--aggregate",
        choices=["median", "best"],
        default="median",
        help="per configuration: the median round (default) or the fastest",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=list(SIZES),
        choices=SIZES,
        help="short: one question; corpus: a ~60 KB agent conversation with tools",
    )
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before measuring")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (= chunks per stream)")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin processes to cores")
    parser.add_argument("--db-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--translation-only", action="store_true", help="CPU per call of each dialect's translation alone (no servers)"
    )
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
