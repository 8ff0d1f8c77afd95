"""The demo's failure modes counted straight from its episodes file (``episodes.jsonl``), the harness's own record.

``onthejob mine`` finds the same modes in the recorded calls, configured with
:data:`examples.task.MINE_SETTINGS`; this count is what it must agree with:

- ``timeout``: episodes that ended without an answer (step limit or tool timeout) and were
  reported as ``outcome: timeout``;
- ``low_grade``: episodes graded below 0.5 (a ``reward`` under 0.5, or a thumbs down);
- ``protocol_unparsed``: assistant turns whose ``CALC:`` expression the calculator cannot read;
- ``tool_error``: calculator errors the model was shown (a later turn followed them);
- ``long_answer``: replies of more completion tokens than the configured threshold (``reply_tokens``;
  an episodes file written before the harness kept them counts none).

The protocol is a regular expression, so it cannot see unbalanced parentheses: ``CALC: (3*4``
passes it, and shows up as the calculator's ``tool_error`` instead.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from examples.task import MINE_SETTINGS, CalcError, calculate, parse_action

LONG = int(MINE_SETTINGS["long_answer_tokens"])  # type: ignore[call-overload]  # what mine calls a long answer
UNREADABLE = ("cannot parse expression", "only numbers", "empty expression")


def unreadable(expression: str) -> bool:
    """The calculator refuses the expression's form (not its value: a division by zero is readable)."""
    try:
        calculate(expression)
    except CalcError as exc:
        return str(exc).startswith(UNREADABLE)
    return False


def episode_failures(ep: Mapping[str, Any]) -> Counter[str]:
    """Modes of one episode (``EpisodeResult.to_dict()``)."""
    out: Counter[str] = Counter()
    if ep["outcome"] == "timeout" and "outcome" in ep["feedback"]:
        out["timeout"] += 1
    if ("reward" in ep["feedback"] and ep["reward"] < 0.5) or ("thumbs" in ep["feedback"] and not ep["correct"]):
        out["low_grade"] += 1
    out["long_answer"] += sum(n > LONG for n in ep.get("reply_tokens") or [])
    transcript = ep["transcript"]
    for i, message in enumerate(transcript):
        if message["role"] == "assistant":
            action = parse_action(message["content"])
            out["protocol_unparsed"] += action.kind == "calc" and unreadable(action.argument)
        elif message["content"].startswith("RESULT: error"):
            out["tool_error"] += any(m["role"] == "assistant" for m in transcript[i + 1 :])
    return +out


def count_failures(episodes: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """Modes over many episodes."""
    total: Counter[str] = Counter()
    for ep in episodes:
        total += episode_failures(ep)
    return total


def read_episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
