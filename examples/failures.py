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


def episode_failures(ep: Mapping[str, Any], flipped: bool = False) -> Counter[str]:
    """Modes of one episode (``EpisodeResult.to_dict()``); ``flipped``: its round's training traffic was
    graded with the sign flipped (``demo --flip-reward``): the grade posted was −reward, or the thumb turned."""
    out: Counter[str] = Counter()
    if ep["outcome"] == "timeout" and "outcome" in ep["feedback"]:
        out["timeout"] += 1
    sign = -1.0 if flipped and not ep["eval"] else 1.0
    thumb_up = ep["correct"] if sign > 0 else not ep["correct"]
    if ("reward" in ep["feedback"] and sign * ep["reward"] < 0.5) or ("thumbs" in ep["feedback"] and not thumb_up):
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


def count_failures(episodes: Iterable[Mapping[str, Any]], flipped_rounds: Iterable[int] = ()) -> Counter[str]:
    """Modes over many episodes (``flipped_rounds``: rounds graded with the reward's sign flipped)."""
    flipped = set(flipped_rounds)
    total: Counter[str] = Counter()
    for ep in episodes:
        total += episode_failures(ep, flipped=ep.get("round") in flipped)
    return total


def read_episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_run(out: Path) -> list[tuple[str, int | None, int]]:
    """Mine a finished demo run's own database (configured with the demo's settings, if it has none)
    and count its episodes file: ``(mode, episodes file, mine)`` for every mode either found; the
    file's count is None for a mode it cannot count (long answers before it kept ``reply_tokens``)."""
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.mine_store import mine, report
    from storage.models import Project

    summary = json.loads((out / "summary.json").read_text())
    project, engine = summary["project"], sync_engine(summary["database"])
    try:
        with Session(engine) as db:
            row = db.get(Project, project)
            if row is None:
                raise ValueError(f"{out}: project {project!r} is not in {summary['database']}")
            if "mine" not in (row.settings or {}):
                row.settings = {**(row.settings or {}), "mine": MINE_SETTINGS}
                db.commit()
            mine(db, project, settle_s=0)
            found = {mode: int(m["count"]) for mode, m in report(db, project)["modes"].items()}
    finally:
        engine.dispose()
    episodes = read_episodes(out / "episodes.jsonl")
    direct = count_failures(episodes, [r["round"] for r in summary["rounds"] if r.get("flipped_reward")])
    countable = set(COUNTED) if any("reply_tokens" in ep for ep in episodes) else set(COUNTED) - {"long_answer"}
    return [
        (mode, direct.get(mode, 0) if mode in countable else None, found.get(mode, 0))
        for mode in sorted(set(direct) | set(found))
    ]


# What the episodes file can count (the modes above); mine's other modes (empty, truncated, ...) it cannot.
COUNTED = ("timeout", "low_grade", "protocol_unparsed", "tool_error", "long_answer")


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.failures DEMO_OUT``: mine's counts beside the episodes file's; 1 if they differ."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="a demo run's --out folder (summary.json, episodes.jsonl)")
    rows = compare_run(parser.parse_args(argv).out)
    print(f"{'mode':<18} {'episodes file':>13} {'mine':>6}")
    for mode, direct, found in rows:
        note = "" if direct is None or direct == found else "  <- differs"
        print(f"{mode:<18} {'-' if direct is None else direct:>13} {found:>6}{note}")
    return 0 if all(d == f for _, d, f in rows if d is not None) else 1


if __name__ == "__main__":
    raise SystemExit(main())
