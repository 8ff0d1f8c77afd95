"""A fast fake vLLM for fault injection and for measuring the proxy's own overhead.

Never a stand-in for the engine in a test that claims the loop works. It answers
in vLLM's shapes (``token_ids``, ``prompt_token_ids``, processed logprobs when
asked, a usage chunk when asked) and misbehaves on request through a body field
the proxy passes through untouched::

    "stub_fault": "500" | "reset" | "stall" | "malformed" | "reset_midstream" | "stall_midstream"
    "stub_gap_ms": 20        # gap between streamed chunks
    "stub_prompt_ids": "chars/4"  # prompt ids as long as the prompt's tokens: one id a 4 characters
                                  # of the rendered tools and messages (prefix-stable across turns)

or through the same words in the last message's text (``stub_fault=reset_midstream``).
With ``--hang-loads`` (``make_app(hang_loads=True)``) every ``/v1/load_lora_adapter`` hangs
without answering, as an engine stuck in a load does (counted in ``/stub/stats`` as ``hung_loads``).
``POST /stub/hang-loads`` with ``{"hang": true}`` (or ``false``) starts (stops) that mid-run; loads
already hung stay hung.

Run: ``python -m bench.stub_upstream --port 9000``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

MODEL = "stub-model"
PROMPT_IDS = list(range(1, 17))
STATS = {"streams": 0, "cancelled": 0, "hung_loads": 0, "completions": 0}  # completions: /v1/completions calls
HANG = web.AppKey("hang_loads", bool)  # whether this app's /v1/load_lora_adapter hangs now
ADAPTERS: set[str] = set()  # names "loaded" by /v1/load_lora_adapter: the proxy can deploy versions to the stub


def _logprobs(chat: bool, n: int, top: int = 0) -> dict[str, Any]:
    if chat:
        return {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []} for _ in range(n)]}
    alternatives = [{"x": -0.5, **{f"y{k}": -1.5 - k for k in range(1, top)}} for _ in range(n)] if top else None
    return {
        "text_offset": list(range(n)),
        "token_logprobs": [-0.5] * n,
        "tokens": ["x"] * n,
        "top_logprobs": alternatives,
    }


def _render(body: dict[str, Any]) -> bytes:
    """The prompt as a template would lay it out: tools, then each message, then the generation prompt.
    A turn's rendering starts with its parent's (the parent's generation prompt opens the reply)."""
    parts = [orjson.dumps(body["tools"])] if body.get("tools") else []
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        parts.append(f"<|{m.get('role')}|>".encode() + text.encode())
    if "messages" not in body:
        parts.append(str(body.get("prompt") or "").encode())
    return b"".join(parts) + b"<|assistant|>"


def prompt_ids(body: dict[str, Any]) -> list[int]:
    """``PROMPT_IDS``, or with ``stub_prompt_ids: "chars/4"`` one id a 4 bytes of the rendered prompt."""
    if body.get("stub_prompt_ids") != "chars/4":
        return PROMPT_IDS
    return [b + 1000 for b in _render(body)[::4]]


def _reply(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    n = int(body.get("max_tokens") or 4)
    ids_in = prompt_ids(body)
    ids = [100 + i for i in range(n)]
    wants = body.get("logprobs")
    top = wants if isinstance(wants, int) and not isinstance(wants, bool) else 0  # completions: the top-k asked for
    prompts = body.get("prompt")
    several = not chat and isinstance(prompts, list) and len(prompts) > 1 and all(isinstance(p, str) for p in prompts)
    choices = []
    for index in range(len(prompts) if several else 1):  # one choice a prompt (the fingerprint probe sends 24)
        choice: dict[str, Any] = {
            "index": index,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": ids if body.get("return_token_ids") else None,
            "logprobs": _logprobs(chat, n, top) if wants is not None and wants is not False else None,
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": "x" * n}
        else:
            choice["text"] = "x" * n
        choices.append(choice)
    return {
        "id": f"stub-{time.monotonic_ns()}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": body.get("model", MODEL),
        "choices": choices,
        "usage": {"prompt_tokens": len(ids_in), "completion_tokens": n, "total_tokens": len(ids_in) + n},
        "prompt_token_ids": ids_in if body.get("return_token_ids") else None,
        "system_fingerprint": "stub",
    }


async def _stream(request: web.Request, body: dict[str, Any], chat: bool) -> web.StreamResponse:
    fault = body.get("stub_fault")
    gap = float(body.get("stub_gap_ms") or 0) / 1000
    n = int(body.get("max_tokens") or 4)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    rid, created = f"stub-{time.monotonic_ns()}", int(time.time())
    want_ids = bool(body.get("return_token_ids"))
    want_lp = body.get("logprobs") not in (None, False)

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": body.get("model", MODEL),
            "choices": choices,
            **extra,
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    if body.get("stub_chunks") is not None:  # fuzzing: send exactly these data lines
        for raw in body["stub_chunks"]:
            await resp.write(b"data: " + str(raw).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    STATS["streams"] += 1
    try:
        await resp.write(chunk([first], prompt_token_ids=prompt_ids(body) if want_ids else None))
        await _tokens(request, resp, body, chat, chunk, n, gap, fault, want_ids, want_lp)
    except (ConnectionResetError, asyncio.CancelledError):
        STATS["cancelled"] += 1  # the proxy closed the connection: the "engine" stops generating
        raise
    return resp


async def _tokens(
    request: web.Request,
    resp: web.StreamResponse,
    body: dict[str, Any],
    chat: bool,
    chunk: Any,
    n: int,
    gap: float,
    fault: Any,
    want_ids: bool,
    want_lp: bool,
) -> None:
    for i in range(n):
        if gap:
            await asyncio.sleep(gap)
        if i == n // 2 and fault == "reset_midstream":
            assert request.transport is not None
            request.transport.abort()
            return
        if i == n // 2 and fault == "stall_midstream":
            await asyncio.sleep(3600)
        if i == n // 2 and fault == "malformed":
            await resp.write(b"data: {not json\n\n")
            continue
        last = i == n - 1
        c: dict[str, Any] = {
            "index": 0,
            "logprobs": _logprobs(chat, 1) if want_lp else None,
            "finish_reason": "length" if last else None,
            "token_ids": [100 + i] if want_ids else None,
        }
        if chat:
            c["delta"] = {"content": "x"} if not last else {"content": "x"}
        else:
            c["text"] = "x"
        await resp.write(chunk([c]))
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        k = len(prompt_ids(body))
        usage = {"prompt_tokens": k, "completion_tokens": n, "total_tokens": k + n}
        await resp.write(chunk([], usage=usage, system_fingerprint="stub"))
    await resp.write(b"data: [DONE]\n\n")


def _knobs_in_text(body: dict[str, Any]) -> dict[str, str]:
    """``stub_fault=...`` / ``stub_gap_ms=...`` words in the last message: a dialect's translation
    (the Responses API, say) passes no unknown body field through to the engine."""
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
    words = content.split() if isinstance(content, str) else []
    return dict(w.split("=", 1) for w in words if w.startswith("stub_") and "=" in w)


async def _call(request: web.Request) -> web.StreamResponse:
    chat = request.path.endswith("/chat/completions")
    STATS["completions"] += not chat  # the proxy's attestation probes use /v1/completions
    body = orjson.loads(await request.read())
    body = {**_knobs_in_text(body), **body}
    fault = body.get("stub_fault")
    if fault == "500":
        return web.json_response({"error": {"message": "stub exploded", "type": "InternalServerError"}}, status=500)
    if fault == "reset":
        assert request.transport is not None
        request.transport.abort()
        return web.Response()
    if fault == "stall":
        await asyncio.sleep(3600)
    if body.get("stream"):
        return await _stream(request, body, chat)
    return web.Response(body=orjson.dumps(_reply(body, chat)), content_type="application/json")


async def _models(_: web.Request) -> web.Response:
    names = [MODEL, *sorted(ADAPTERS)]
    return web.json_response({"object": "list", "data": [{"id": n, "object": "model", "parent": None} for n in names]})


async def _load_adapter(request: web.Request) -> web.Response:
    ADAPTERS.add(str((await request.json())["lora_name"]))  # no weights: replies do not change
    return web.Response(text="ok")


async def _load_or_hang(request: web.Request) -> web.Response:
    return await (_hang_load(request) if request.app[HANG] else _load_adapter(request))


async def _set_hang(request: web.Request) -> web.Response:
    request.app[HANG] = bool((await request.json())["hang"])
    return web.json_response({"hang_loads": request.app[HANG]})


async def _hang_load(_: web.Request) -> web.Response:
    STATS["hung_loads"] += 1
    await asyncio.Event().wait()  # never set: the connection stays open, unanswered
    raise AssertionError("unreachable")


async def _stats(_: web.Request) -> web.Response:
    return web.json_response(STATS)


def make_app(hang_loads: bool = False) -> web.Application:
    app = web.Application()
    app[HANG] = hang_loads
    app.router.add_get("/stub/stats", _stats)
    app.router.add_post("/stub/hang-loads", _set_hang)
    app.router.add_post("/v1/chat/completions", _call)
    app.router.add_post("/v1/completions", _call)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/load_lora_adapter", _load_or_hang)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--hang-loads", action="store_true", help="never answer /v1/load_lora_adapter")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = make_app(args.hang_loads)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, shutdown_timeout=1)


if __name__ == "__main__":
    main()
