"""A minimal OpenAI-compatible chat client for the judge (aiohttp).

Not the openai SDK: the judge needs one call shape, our own headers on it
(the ``judge`` tag, so the proxy records the judge's own calls as never to be
trained on) and errors in our tree; aiohttp is already a dependency (the benches' load generator).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from judge.errors import JudgeCallError
from storage.judge_config import JUDGE_TAG

TOP_LOGPROBS = 20  # what the probability readout asks for (vLLM's default cap is 20)


@dataclass
class JudgeClient:
    """Chat completions against ``base_url`` (ending in ``/v1``); one retry on connection errors and 5xx."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 120.0
    max_tokens: int = 256
    temperature: float = 0.0  # a judge should be repeatable
    headers: Mapping[str, str] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    async def __aenter__(self) -> JudgeClient:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json", "X-Onthejob-Tags": JUDGE_TAG, **self.headers}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    async def complete(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The assistant's text for ``messages`` (the first choice)."""
        body = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        return _content(await self._post(body), self.base_url)

    async def probability(self, messages: Sequence[Mapping[str, Any]], labels: tuple[str, str]) -> float | None:
        """P(labels[0]) / (P(labels[0]) + P(labels[1])) for the reply's first token; None if neither is in the top 20.

        A label counts by its first token's text (case and surrounding spaces ignored), summed over
        every top-20 entry that spells it ("positive", " Positive").
        """
        body = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
        }
        payload = await self._post(body)
        try:
            top = payload["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise JudgeCallError(
                f"{self.base_url} answered without logprobs; readout 'probability' needs an endpoint that returns them"
            ) from None
        good, bad = (label.strip().lower() for label in labels)
        mass = {good: 0.0, bad: 0.0}
        for entry in top:
            token = str(entry.get("token", "")).strip().lower()
            if token and token in mass:
                mass[token] += math.exp(float(entry["logprob"]))
        total = mass[good] + mass[bad]
        return mass[good] / total if total > 0 else None

    async def _post(self, body: Mapping[str, Any]) -> Any:
        """POST ``body`` to chat completions: the parsed 200 answer; one retry on connection errors and 5xx."""
        if self._session is None:
            raise JudgeCallError("JudgeClient is used outside 'async with': open it first")
        url = self.base_url.rstrip("/") + "/chat/completions"
        last: Exception | None = None
        for attempt in range(2):
            try:
                async with self._session.post(url, json=body, headers=self._headers()) as resp:
                    if resp.status >= 500 and attempt == 0:
                        last = JudgeCallError(f"{url} answered {resp.status}")
                        continue
                    payload = await resp.json(content_type=None)
                    if resp.status != 200:
                        raise JudgeCallError(f"{url} answered {resp.status}: {_error_text(payload)}")
                    return payload
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                last = exc
        raise JudgeCallError(f"the judge endpoint {url} failed twice: {last!r}; is it running?") from last


def _error_text(payload: Any) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return str(payload["error"].get("message", payload["error"]))
    return str(payload)[:300]


def _content(payload: Any, url: str) -> str:
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeCallError(f"{url} answered 200 without choices[0].message.content") from None
    return content if isinstance(content, str) else ""
