"""A scripted OpenAI-compatible judge: a real HTTP server answering chat completions by rule.

It grades an attempt "good" when its transcript holds the right answer
(``ANSWER: 12``); ``inverted`` flips every verdict; ``mumble`` answers with no
score at all. A request that asks for ``logprobs`` (the probability readout) gets
one token whose top log-probabilities favour " positive" or "negative" by the same
rule (``mumble``: neither word among them). It records each request's headers and body.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

RIGHT = "ANSWER: 12"


@dataclass
class Scripted:
    url: str  # base URL ending in /v1
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)


def _score(block: str, inverted: bool) -> int:
    good = RIGHT in block
    return 9 if good != inverted else 1


def _one_token(body: dict[str, Any], good: bool, inverted: bool, mumble: bool) -> dict[str, Any]:
    likely, unlikely = (" positive", "negative") if good != inverted else ("negative", " Positive")
    top = [{"token": "The", "logprob": -0.1}, {"token": ",", "logprob": -3.0}]
    if not mumble:
        top = [{"token": likely, "logprob": -0.2}, {"token": unlikely, "logprob": -1.8}, *top]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": top[0]["token"]},
        "finish_reason": "length",
        "logprobs": {"content": [{"token": top[0]["token"], "logprob": top[0]["logprob"], "top_logprobs": top}]},
    }
    return {"id": "chatcmpl-scripted", "object": "chat.completion", "model": body.get("model"), "choices": [choice]}


@asynccontextmanager
async def scripted_judge(*, inverted: bool = False, mumble: bool = False) -> AsyncIterator[Scripted]:
    state = Scripted(url="")

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        state.requests.append((dict(request.headers), body))
        text = body["messages"][-1]["content"]
        if body.get("logprobs"):
            return web.json_response(_one_token(body, RIGHT in text, inverted, mumble))
        blocks = re.split(r"^Attempt ([A-Z]):$", text, flags=re.MULTILINE)
        if mumble:
            reply = "It seems fine to me, hard to say."
        elif len(blocks) > 1:  # relative: blocks = [head, letter, text, letter, text, ...]
            lines = [f"{blocks[i]}: {_score(blocks[i + 1], inverted)}" for i in range(1, len(blocks), 2)]
            reply = "Compared the attempts.\n" + "\n".join(lines)
        else:
            reply = (
                f"The last answer {'matches' if RIGHT in text else 'misses'} the task.\nScore: {_score(text, inverted)}"
            )
        return web.json_response(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield state
    finally:
        await runner.cleanup()
