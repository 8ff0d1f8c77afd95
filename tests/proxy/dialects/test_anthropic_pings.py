"""A silent engine stream gets Anthropic ``ping`` events, and they never split or delay a real event.

Driven without a server: a fake engine response that goes quiet until the proxy has pinged,
so the test waits on events, never on the clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy import capture
from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.anthropic_stream import PING
from proxy.dialects.base import Exchange
from proxy.streaming import StreamedReply


def chunk(**fields: Any) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "model": "m", **fields}) + b"\n\n"


class Silent:
    """An engine response: the first chunk, then silence until ``gate`` opens, then the rest."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def chunks(self) -> AsyncIterator[bytes]:
        yield chunk(prompt_token_ids=[1, 2, 3], choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        await self.gate.wait()
        yield chunk(choices=[{"index": 0, "delta": {"content": "Hi"}, "token_ids": [7]}])
        yield chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [2]}])
        yield chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
        yield b"data: [DONE]\n\n"

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_silent_engine_gets_pings_between_whole_events() -> None:
    async def scenario() -> list[dict[str, Any]]:
        gate, pinged, sent = asyncio.Event(), asyncio.Event(), []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message.get("body") == PING:
                pinged.set()

        async def finish(_: Any) -> None:
            return None

        dialect = AnthropicDialect()
        dialect.ping_interval_s = 0.01
        ex = Exchange(id="msg_1", model="m", created=0, request={}, chat={})
        call = StreamedReply(
            Silent(gate),
            endpoint="chat",
            wants=capture.Wants(False, False, False, True),
            alias="m",  # type: ignore[arg-type]
            headers={},
            dialect=(dialect, dialect.stream(ex)),
            fingerprints={},
            base="b",
            inflight=set(),
            finish=finish,
        )
        streaming = asyncio.create_task(call._stream(send))
        await asyncio.wait_for(pinged.wait(), 30)  # the engine is silent: a ping must come
        gate.set()
        await asyncio.wait_for(streaming, 30)
        raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return [orjson.loads(f.split(b"\ndata: ")[1]) for f in raw.split(b"\n\n") if f.strip()]

    events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and "ping" in kinds
    real = [k for k in kinds if k != "ping"]
    assert real == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert kinds[-1] == "message_stop"  # no ping after the end
