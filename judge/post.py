"""Posting the judge's grades as ordinary feedback through the proxy's ``POST /v1/feedback``.

Each grade is ``{"name": "reward", "source": "judge", "value": score, "comment":
reasoning}`` on the session, with an idempotency key made of the judge
configuration, the session and the comment it read: re-running the judge
posts nothing new, while a new comment or a new rubric yields a new grade
(the newest from source ``judge`` then wins, history kept).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import aiohttp

from judge.errors import JudgeCallError
from judge.score import Judged
from storage.judge_config import JUDGE_SOURCE

BATCH = 100  # the API's batch limit
MAX_COMMENT_CHARS = 4000


def judge_key(fingerprint: str, session_id: str, comment: str | None) -> str:
    """Idempotency key of one judge grade (≤ 200 characters, as the API requires)."""
    digest = hashlib.sha256(f"{session_id}\x00{comment or ''}".encode()).hexdigest()[:24]
    return f"judge:{fingerprint}:{digest}"


def feedback_items(judged: Sequence[Judged], fingerprint: str, mode: str) -> list[dict[str, Any]]:
    """The feedback bodies for the readable grades (an unreadable reply posts nothing)."""
    out = []
    for j in judged:
        if j.score is None:
            continue
        out.append(
            {
                "target": {"session_id": j.item.session_id},
                "name": "reward",
                "value": j.score,
                "comment": j.reasoning[:MAX_COMMENT_CHARS] or "(no reasoning given)",
                "source": JUDGE_SOURCE,
                "id": judge_key(fingerprint, j.item.session_id, j.item.comment),
                "metadata": {"judge": fingerprint, "mode": mode, "read_comment": j.item.comment is not None},
            }
        )
    return out


async def post_feedback(proxy_url: str, api_key: str | None, items: Sequence[dict[str, Any]]) -> int:
    """POST the items in batches; returns how many the proxy stored. Raises on any refusal."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = proxy_url.rstrip("/") + "/v1/feedback"
    stored = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for start in range(0, len(items), BATCH):
            chunk = list(items[start : start + BATCH])
            async with session.post(url, json=chunk, headers=headers) as resp:
                body = await resp.json(content_type=None)
                if resp.status not in (201, 202):
                    raise JudgeCallError(f"POST {url} answered {resp.status}: {body}")
                stored += len(body.get("data", []))
    return stored
