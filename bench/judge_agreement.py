"""The judge is a model: how well SmolLM2-135M, asked as a judge, agrees with the demo's grades.

Runs demo episodes through a real vLLM engine with the demo harness (held-out
problems greedy, as the demo's calibration set; training problems sampled at
T = 0.7, several attempts each, for relative mode), grades them with the task's
grader (the labels), writes the comments arm's comment for each, and then asks
the served model itself, through the judge's own client and prompts, to score
them under the demo's rubric:

* ``absolute + comment``: the conversation with the reviewer's comment (what the
  judge does for comment-only sessions);
* ``absolute, no comment``: the conversation alone (self-evaluation, the ``none`` arm);
* ``relative``: the attempts of one problem side by side (RULER style);
* ``keyword rule``: :func:`judge.baseline.keyword_score` on the comment;
* ``probe: P(yes)``: not the judge, a readout beside it: the model's probability of
  "yes" to "was it correct and brief?" from its first token's top logprobs.

Prints Spearman's ρ and accuracy at the threshold against the labels, the
unreadable replies, and what the gate (ρ ≥ 0.6) does with each.

    .venv/bin/python bench/judge_agreement.py [--heldout 48] [--problems 8 --attempts 4] [--episodes eps.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from examples.episodes import run_episodes
from examples.feedback import comment
from examples.harness import EpisodeResult, Harness, HarnessConfig
from examples.task import Problem, make_problems, parse_number
from judge.calibrate import Agreement, agreement, gate
from judge.client import JudgeClient
from judge.prompts import absolute_messages
from judge.run import baseline_agreement
from judge.score import Item, calibrate
from storage.judge_config import JudgeSettings

RUBRIC = (
    "The assistant solves an arithmetic word problem with a calculator: it writes CALC: <expression>, "
    "reads RESULT, then answers ANSWER: <number>. A good answer has the right number and takes few steps. "
    "A wrong number is bad whatever else it does. If the user left feedback, it says whether the answer was right."
)


def _items(results: list[EpisodeResult], problems: dict[str, Problem], with_comment: bool) -> list[Item]:
    out = []
    for r in results:
        if r.outcome == "error":
            continue
        answer = parse_number(r.answer) if r.answer is not None else None
        text = comment(problems[r.problem_id], answer, r.correct, r.brevity, seed=r.session_id)
        out.append(Item(r.session_id, list(r.transcript), text if with_comment else None, r.problem_id, r.reward))
    return out


def _line(name: str, a: Agreement | None) -> str:
    if a is None:
        return f"| {name} | — | — | — | — | — |"
    v = gate(a, 0.6, 8)
    verdict = "accepted" if v.accepted else f"refused ({v.reason})"
    return f"| {name} | {a.n} | {a.unreadable} | {a.spearman:+.2f} | {a.accuracy:.2f} | {verdict} |"


async def _judge(
    url: str, model: str, heldout: list[Item], bare: list[Item], grouped: list[Item], max_tokens: int
) -> list[str]:
    absolute = JudgeSettings(rubric=RUBRIC)
    relative = JudgeSettings(rubric=RUBRIC, mode="relative")
    rows = []
    async with JudgeClient(url, model, max_tokens=max_tokens) as client:
        for name, cfg, items in (
            ("135M, absolute + comment (held-out)", absolute, heldout),
            ("135M, absolute, no comment (held-out)", absolute, bare),
            ("135M, absolute + comment (sampled)", absolute, grouped),
            ("135M, relative + comment (sampled, per problem)", relative, grouped),
        ):
            started = time.perf_counter()
            a = await calibrate(client, cfg, items)
            rows.append(_line(f"{name} [{time.perf_counter() - started:.0f}s]", a))
            print(rows[-1], flush=True)  # long on a busy CPU: show each as it lands
    for name, items in (
        ("probe: 135M P(yes), + comment (held-out)", heldout),
        ("probe: 135M P(yes), no comment (held-out)", bare),
    ):
        rows.append(_line(name, await _yes_no(url, model, items, absolute.decision_threshold)))
        print(rows[-1], flush=True)
    rows.append(_line("keyword rule on the comment (held-out)", baseline_agreement(absolute, heldout)))
    rows.append(_line("keyword rule on the comment (sampled)", baseline_agreement(absolute, grouped)))
    return rows


async def _yes_no(url: str, model: str, items: list[Item], threshold: float) -> Agreement:
    """A probe beside the judge: P(yes) / (P(yes) + P(no)) from the first token's top logprobs.

    Tiny models rarely write a score line, but their next-token distribution may still rank
    sessions; this reads it directly (what the judge itself does not do: it reads text).
    """
    import aiohttp

    scores: list[float | None] = []
    async with aiohttp.ClientSession() as session:
        for item in items:
            question = "Was the assistant's last answer correct and brief? Answer yes or no."
            messages = absolute_messages(RUBRIC, item.conversation, item.comment)[:1] + [
                {
                    "role": "user",
                    "content": absolute_messages(RUBRIC, item.conversation, item.comment)[1]["content"].replace(
                        "Grade the assistant's last answer.", question
                    ),
                }
            ]
            body = {
                "model": model,
                "messages": messages,
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": True,
                "top_logprobs": 20,
            }
            async with session.post(f"{url}/chat/completions", json=body) as resp:
                top = (await resp.json())["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            yes = sum(math.exp(t["logprob"]) for t in top if t["token"].strip().lower() == "yes")
            no = sum(math.exp(t["logprob"]) for t in top if t["token"].strip().lower() == "no")
            scores.append(yes / (yes + no) if yes + no > 0 else None)
    return agreement(scores, [float(i.label or 0.0) for i in items], threshold)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", type=int, default=48)
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--upstream", default=None, help="a running engine's base URL (else one is started)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--episodes", default=None, help="JSON file: episodes are saved there, and reused if it exists")
    parser.add_argument("--judge-tokens", type=int, default=96, help="max_tokens of each judge reply")
    args = parser.parse_args()

    from engine.launcher import Engine, EngineConfig
    from engine.weights import resolve_model

    info = resolve_model(args.model)
    engine: Any = None
    url = args.upstream
    if url is None:
        engine = Engine(
            info,
            EngineConfig(port=_free_port(), threads=args.threads),
            log=Path(tempfile.gettempdir()) / "judge-agreement-engine.log",
        )
        engine.start()
        url = engine.url
    try:
        cfg = HarnessConfig(base_url=f"{url}/v1", api_key="unused", model=info.name)
        heldout_p = make_problems("heldout", args.heldout)
        train_p = make_problems("train", args.problems, seed=7)
        problems = {p.id: p for p in heldout_p + train_p}
        cache = Path(args.episodes) if args.episodes else None
        if cache is not None and cache.exists():  # episodes are the slow part on a busy CPU: reuse them
            saved = json.loads(cache.read_text())
            heldout, sampled = ([EpisodeResult(**r) for r in saved[k]] for k in ("heldout", "sampled"))
        else:
            with Harness(cfg) as h:
                heldout = run_episodes(h, heldout_p, eval=True, workers=4, progress=False)
                sampled = run_episodes(h, train_p, attempts=args.attempts, workers=4, progress=False)
            if cache is not None:
                cache.write_text(
                    json.dumps({"heldout": [r.to_dict() for r in heldout], "sampled": [r.to_dict() for r in sampled]})
                )
        for name, rs in (("held-out (greedy)", heldout), ("sampled (T=0.7)", sampled)):
            ok = [r for r in rs if r.outcome != "error"]
            print(
                f"{name}: {len(ok)} episodes, accuracy {sum(r.correct for r in ok) / max(len(ok), 1):.0%}, "
                f"mean reward {sum(r.reward for r in ok) / max(len(ok), 1):.3f}",
                flush=True,
            )
        rows = asyncio.run(
            _judge(
                f"{url}/v1",
                info.name,
                _items(heldout, problems, True),
                _items(heldout, problems, False),
                _items(sampled, problems, True),
                args.judge_tokens,
            )
        )
        print("\n| judge | pairs | unreadable | Spearman ρ | accuracy at 0.5 | gate (ρ ≥ 0.6, ≥ 8 pairs) |")
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
    finally:
        if engine is not None:
            engine.stop()


if __name__ == "__main__":
    main()
