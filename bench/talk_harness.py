"""The scripted harness of bench/talk_cases.py: a policy and its tool layer that inject the talk's faults (failed
tool calls, shorter answers, tool floods cut at the deadline), speaking to the proxy like any harness does."""

from __future__ import annotations

import random
from typing import Any

import httpx

from bench.talk_scenarios import ANSWER, CUT_TOKENS, DEADLINE, FLOOD, THOUGHT, Phase


class Harness:
    """The scripted policy and its tool layer, speaking to the proxy like any harness."""

    def __init__(self, proxy: str, alias: str, client: httpx.AsyncClient, cut_extra: dict[str, Any]) -> None:
        self.proxy, self.alias, self.client = proxy, alias, client
        self.cut_extra = cut_extra  # the stub streams a reply at once: a gap lets the hang-up land mid-stream
        self.calls = 0

    async def _call(self, session: str, messages: list[dict[str, Any]], tokens: int, *, cut: bool = False) -> str:
        body = {
            "model": self.alias,
            "messages": messages,
            "max_tokens": tokens,
            "min_tokens": tokens,
            "temperature": 1.0,
        }
        headers = {"x-session-id": session}
        self.calls += 1
        if cut:  # the episode's deadline passes while the model is still writing: the harness hangs up
            async with self.client.stream(
                "POST",
                f"{self.proxy}/v1/chat/completions",
                json={**body, **self.cut_extra, "stream": True},
                headers=headers,
            ) as resp:
                async for _ in resp.aiter_bytes():
                    break
            return ""
        resp = await self.client.post(f"{self.proxy}/v1/chat/completions", json=body, headers=headers)
        resp.raise_for_status()
        return str(resp.json()["choices"][0]["message"].get("content") or "")

    async def session(self, sid: str, phase: Phase, rng: random.Random) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {sid}: look it up and answer"}]
        tools = FLOOD if rng.random() < phase.flood else 1 + sum(rng.random() < 0.5 for _ in range(4))
        for step in range(tools):
            if step == DEADLINE:
                await self._call(sid, messages, CUT_TOKENS, cut=True)
                return  # timed out: the talk's harness dropped such attempts (no grade)
            reply = await self._call(sid, messages, THOUGHT)
            failed = rng.random() < phase.tool_fail
            result = "Error: search backend timed out (injected)" if failed else f"result {step}: 3 matches"
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "tool", "tool_call_id": f"call_{step}", "content": result},
            ]
        length = max(1, round(ANSWER * phase.answer * rng.uniform(0.6, 1.4)))
        await self._call(sid, messages, length)
        outcome = "success" if rng.random() < 0.7 else "failure"
        fb = {"target": {"session_id": sid}, "name": "outcome", "value": outcome, "source": "harness"}
        (await self.client.post(f"{self.proxy}/v1/feedback", json=fb)).raise_for_status()
