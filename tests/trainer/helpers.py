"""Build :class:`Trajectory` objects by hand, the way storage's assembly would."""

from __future__ import annotations

import random
from typing import Any

from storage.trajectories import Trajectory, Turn


def make_trajectory(
    tid: str,
    prompt: list[int],
    sampled: list[int],
    *,
    reward: float | None = 1.0,
    logprobs: list[float | None] | None = None,
    sampling: dict[str, Any] | None = None,
    adapter_version: int | None = None,
    task: str | None = None,
    group: str | None = None,
    tags: list[str] | None = None,
) -> Trajectory:
    """One prompt and one sampled turn; ``logprobs`` are those of the sampled tokens."""
    start = len(prompt)
    lps: list[float | None] = [None] * start + list(logprobs if logprobs is not None else [-1.0] * len(sampled))
    turn = Turn(
        completion_id=f"cmpl-{tid}",
        choice_index=0,
        start=start,
        end=start + len(sampled),
        adapter_version=adapter_version,
        served_model="m" if adapter_version is None else f"a@v{adapter_version}",
        sampling=sampling or {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0},
    )
    return Trajectory(
        id=tid,
        project_id="default",
        session_id=f"s-{tid}",
        task_id=task,
        alias="a",
        token_ids=prompt + sampled,
        mask=[0] * start + [1] * len(sampled),
        logprobs=lps,
        turns=[turn],
        completion_ids=[turn.completion_id],
        reward=reward,
        tags=tags or [],
        group=group,
    )


def random_tokens(rng: random.Random, n: int, vocab: int = 250) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]
