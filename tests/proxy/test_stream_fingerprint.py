"""A streamed call's terminal chunk is held for the engine's fingerprint only while the proxy does not
know whether this engine stamps one: after the first usage chunk without one, terminal chunks go out
as they arrive (before, every stream from such an engine held its last chunk until the usage chunk).

The engine here is a few lines of the test's own (a fault the real engine cannot produce on demand:
its usage chunk withheld until the client has read the terminal chunk), not a stand-in for vLLM.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from tests.conftest import free_port
from tests.proxy.conftest import ProxyFactory

MODEL = "no-fingerprint"


class Engine:
    """Streams one token and a terminal chunk, then waits for ``release`` before its usage chunk."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.usage_sent = threading.Event()
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "parent": None}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            obj = {
                "id": "e-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": MODEL,
                "choices": choices,
                **extra,
            }
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        ids = body.get("return_token_ids")
        await resp.write(
            chunk(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                prompt_token_ids=[1, 2, 3] if ids else None,
            )
        )
        await resp.write(
            chunk([{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop", "token_ids": [7] if ids else None}])
        )
        # Held by the proxy, the terminal chunk never reaches the client: after 10 s the usage chunk goes anyway.
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 10)
        self.usage_sent.set()
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        await resp.write(chunk([], usage=usage))  # no system_fingerprint, ever
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = Engine()
    eng.thread.start()
    eng.ready.wait(30)
    yield eng
    eng.release.set()
    asyncio.run_coroutine_threadsafe(eng.runner.cleanup(), eng.loop).result(30)
    eng.loop.call_soon_threadsafe(eng.loop.stop)
    eng.thread.join(30)


def _terminal_before_usage(client: httpx.Client, engine: Engine) -> bool:
    """Stream one call; True when its terminal chunk reached the client before the engine's usage chunk."""
    engine.release.clear()
    engine.usage_sent.clear()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    early = None
    with client.stream("POST", "/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            choices = orjson.loads(line[6:]).get("choices") or [] if line.startswith("data: {") else []
            if early is None and any(c.get("finish_reason") for c in choices):
                early = not engine.usage_sent.is_set()
                engine.release.set()  # the engine may send its usage chunk now
    return bool(early)


def test_terminal_chunk_not_held_once_the_engine_is_known_to_send_no_fingerprint(
    start_proxy: ProxyFactory, engine: Engine, pg_factory: Any
) -> None:
    proxy = start_proxy(f"http://127.0.0.1:{engine.port}", pg_factory(), env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    with httpx.Client(base_url=proxy.v1, timeout=60) as client:
        # The first stream cannot know yet: its terminal chunk waits for the usage chunk (10 s here).
        first = _terminal_before_usage(client, engine)
        second = _terminal_before_usage(client, engine)
    assert (first, second) == (False, True)
