"""Scoring sessions with the judge model: absolute (one call per session) or relative (one per task group).

Pure over :class:`Item` (what storage gives) and an object with the client's
``complete`` method, so a test can hand it any OpenAI-compatible endpoint.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from judge.calibrate import Agreement, agreement
from judge.parse import parse_score, parse_scores, to_scale
from judge.prompts import MAX_ATTEMPTS, absolute_messages, probability_messages, relative_messages
from storage.judge_config import JudgeSettings

MAX_REASONING_CHARS = 2000
_SCORE_LINES = re.compile(r"^\W*(?:score\b|attempt\s+[A-Z]\b|[A-Z]\s*[:=)]).*$", re.IGNORECASE | re.MULTILINE)


class Completer(Protocol):
    async def complete(self, messages: Sequence[Mapping[str, Any]]) -> str: ...

    async def probability(self, messages: Sequence[Mapping[str, Any]], labels: tuple[str, str]) -> float | None: ...


@dataclass(frozen=True)
class Item:
    """One session as the judge sees it: the conversation (request messages + the last reply) and comments."""

    session_id: str
    conversation: list[dict[str, Any]]
    comment: str | None = None
    task_id: str | None = None
    label: float | None = None  # the existing human/harness grade (calibration), on the project's scale
    completion_id: str | None = None  # the last call (where a per-call grade would go)


@dataclass(frozen=True)
class Judged:
    """The judge's conclusion on one item; ``score`` None when its reply held no readable score."""

    item: Item
    score: float | None  # on the project's scale
    reasoning: str
    reply: str = field(repr=False)


def reasoning_of(reply: str) -> str:
    """The reply without its score lines: what is posted as the grade's comment."""
    text = _SCORE_LINES.sub("", reply).strip()
    return (text or reply.strip())[:MAX_REASONING_CHARS]


async def judge_items(
    client: Completer, cfg: JudgeSettings, items: Sequence[Item], concurrency: int = 4, *, implicit: bool = False
) -> list[Judged]:
    """Score every item under ``cfg`` (mode, rubric, scale); order preserved.

    ``implicit``: the project reads the next user turn as feedback, and the rubric says so.
    """
    limit = asyncio.Semaphore(concurrency)
    if cfg.readout == "probability":
        examples = [(e.text, e.good) for e in cfg.examples]

        async def read(item: Item) -> list[Judged]:
            async with limit:
                messages = probability_messages(
                    cfg.rubric,
                    cfg.labels,
                    examples,
                    item.conversation,
                    item.comment,
                    max_chars=cfg.max_transcript_chars,
                )
                p = await client.probability(messages, cfg.labels)
            score = None if p is None else to_scale(p, cfg.scale)
            word = "unreadable" if p is None else f"P({cfg.labels[0]}) = {p:.2f}"
            return [Judged(item, score, f"{word} (probability readout)", word)]

        results = await asyncio.gather(*(read(i) for i in items))
    elif cfg.mode == "absolute":

        async def one(item: Item) -> list[Judged]:
            async with limit:
                messages = absolute_messages(
                    cfg.rubric,
                    item.conversation,
                    item.comment,
                    implicit=implicit,
                    max_chars=cfg.max_transcript_chars,
                )
                reply = await client.complete(messages)
            fraction = parse_score(reply)
            score = None if fraction is None else to_scale(fraction, cfg.scale)
            return [Judged(item, score, reasoning_of(reply), reply)]

        chunks = [[i] for i in items]
        results = await asyncio.gather(*(one(c[0]) for c in chunks))
    else:

        async def group(members: list[Item]) -> list[Judged]:
            async with limit:
                messages = relative_messages(
                    cfg.rubric,
                    [m.conversation for m in members],
                    [m.comment for m in members],
                    max_chars=cfg.max_transcript_chars,
                )
                reply = await client.complete(messages)
            fractions = parse_scores(reply, len(members))
            reasoning = reasoning_of(reply)
            return [
                Judged(m, None if fractions is None else to_scale(fractions[i], cfg.scale), reasoning, reply)
                for i, m in enumerate(members)
            ]

        chunks = groups(items)
        results = await asyncio.gather(*(group(c) for c in chunks))
    by_id = {id(j.item): j for batch in results for j in batch}
    return [by_id[id(i)] for i in items]


def groups(items: Sequence[Item], size: int = MAX_ATTEMPTS) -> list[list[Item]]:
    """Items of one task side by side (in chunks of at most ``size``); an item without a task is alone."""
    by_task: dict[str, list[Item]] = {}
    out: list[list[Item]] = []
    for item in items:
        if item.task_id is None:
            out.append([item])
        else:
            by_task.setdefault(item.task_id, []).append(item)
    for members in by_task.values():
        out.extend(members[i : i + size] for i in range(0, len(members), size))
    return out


async def calibrate(client: Completer, cfg: JudgeSettings, labelled: Sequence[Item]) -> Agreement:
    """Score the labelled items and compare with their labels (see :mod:`judge.calibrate`)."""
    items = [i for i in labelled if i.label is not None]
    judged = await judge_items(client, cfg, items)
    return agreement(
        [j.score for j in judged], [float(i.label) for i in items if i.label is not None], cfg.decision_threshold
    )
