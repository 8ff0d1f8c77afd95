"""Many episodes: run them on a small thread pool, and summarise what they did.

:func:`run_episodes` runs any harness's :meth:`episode` (:class:`examples.harness.Harness`, or one
that runs another task family's problems) over a list of problems; :func:`summarise` turns the
results into the figures the demo prints: mean reward with its standard error, accuracy, completion
tokens, timeouts, and how many episodes failed and why (:func:`failure_reason`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tqdm import tqdm

from examples.harness import EpisodeResult

P = TypeVar("P", contravariant=True)


class RunsEpisodes(Protocol[P]):
    """What :func:`run_episodes` needs: a :class:`Harness`, or one that runs another task family's problems."""

    def episode(self, problem: P, *, eval: bool = ..., session_id: str | None = ...) -> EpisodeResult: ...


def run_episodes(
    harness: RunsEpisodes[P],
    problems: Sequence[P],
    *,
    eval: bool = False,
    attempts: int = 1,
    workers: int = 8,
    desc: str | None = None,
    progress: bool = True,
) -> list[EpisodeResult]:
    """Run every problem ``attempts`` times on a small thread pool; results in problem order."""
    jobs = [p for p in problems for _ in range(attempts)]
    results: list[EpisodeResult | None] = [None] * len(jobs)
    bar = tqdm(
        total=len(jobs), desc=desc or ("held-out" if eval else "traffic"), unit="ep", disable=not progress, leave=False
    )
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode") as pool:
        futures = {pool.submit(harness.episode, p, eval=eval): i for i, p in enumerate(jobs)}
        for future in futures:
            results[futures[future]] = future.result()
            bar.update(1)
    bar.close()
    return [r for r in results if r is not None]


@dataclass(frozen=True)
class Summary:
    """Aggregate of a list of episodes (errors are excluded from the reward mean, as the trainer does)."""

    n: int
    mean_reward: float
    stderr: float
    accuracy: float
    mean_completion_tokens: float
    timeouts: int
    errors: int
    failures: dict[str, int] = field(default_factory=dict)  # why the errors failed (failure_reason) → how many


_STATUS = re.compile(r"Error code: (\d{3})")
_MESSAGE = re.compile(r"""['"]message['"]: ['"]((?:[^'"\\]|\\.)*)""")


def failure_reason(error: str | None) -> str:
    """A failed episode's error in a few words for counting: ``HTTP 502: no engine replica may serve …``."""
    if not error:
        return "unknown"
    status, message = _STATUS.search(error), _MESSAGE.search(error)
    kind = error.split(":", 1)[0]
    text = message.group(1) if message else error.split(":", 1)[-1].strip()
    text = re.sub(r"\b[0-9a-f]{12,}\b", "…", text)[:100]  # ids differ per call: left out so reasons group
    return f"HTTP {status.group(1)}: {text}" if status else f"{kind}: {text}"


def summarise(results: Sequence[EpisodeResult]) -> Summary:
    """Mean reward with its standard error, accuracy, tokens, timeouts, errors."""
    graded = [r for r in results if r.outcome != "error"]
    n = len(graded)
    rewards = [r.reward for r in graded]
    mean = sum(rewards) / n if n else 0.0
    var = sum((x - mean) ** 2 for x in rewards) / (n - 1) if n > 1 else 0.0
    return Summary(
        n=n,
        mean_reward=mean,
        stderr=(var / n) ** 0.5 if n else 0.0,
        accuracy=sum(r.correct for r in graded) / n if n else 0.0,
        mean_completion_tokens=sum(r.completion_tokens for r in graded) / n if n else 0.0,
        timeouts=sum(r.outcome == "timeout" for r in results),
        errors=len(results) - n,
        failures=dict(Counter(failure_reason(r.error) for r in results if r.outcome == "error")),
    )
