"""``onthejob mine`` on demo-shaped traffic agrees with a direct count from the episodes file.

The episodes are written the way the demo writes them (``EpisodeResult.to_dict()``), and
their calls and feedback are stored the way the proxy and the harness store them: each
assistant turn one call whose request is the transcript before it, session grades and
thumbs on the last call as the harness posts them. No engine here: a run of the demo
itself is the same comparison on real traffic.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from examples.failures import count_failures
from examples.task import EXAMPLE, MINE_SETTINGS, SYSTEM_PROMPT, TOKEN_BUDGET
from storage.mine_store import mine, report
from tests.storage.rows import choice, feedback_row, insert, new_project, row

OPEN = [{"role": "system", "content": SYSTEM_PROMPT}, *EXAMPLE, {"role": "user", "content": "Tom has 3 bags of 4."}]


def episode(
    turns: list[str],
    *,
    outcome: str,
    correct: bool = False,
    reward: float = 0.0,
    feedback: list[str] | None = None,
    tokens: list[int] | None = None,
) -> dict[str, Any]:
    """An episode whose assistant turns are ``turns`` (RESULT lines as the harness's calculator answers)."""
    from examples.task import calculate

    transcript = list(OPEN)
    for i, text in enumerate(turns):
        transcript.append({"role": "assistant", "content": text})
        if text.startswith("CALC:") and (i + 1 < len(turns) or outcome == "timeout"):
            try:
                result = calculate(text.removeprefix("CALC:").split("=")[0].strip())
            except ValueError as exc:
                result = f"error: {exc}"
            transcript.append({"role": "user", "content": f"RESULT: {result}"})
    return {
        "session_id": f"ep-{uuid.uuid4().hex[:10]}",
        "outcome": outcome,
        "correct": correct,
        "reward": reward,
        "feedback": feedback or [],
        "transcript": transcript,
        "reply_tokens": tokens or [2] * len(turns),
    }


EPISODES = [
    episode(["CALC: 3*4", "ANSWER: 12"], outcome="answered", correct=True, reward=1.0, feedback=["reward"]),
    episode(["CALC: 3+4", "ANSWER: 7"], outcome="answered", reward=0.0, feedback=["reward"]),  # wrong
    episode(["CALC: 3 bags * 4", "ANSWER: 12"], outcome="answered", correct=True, reward=0.3, feedback=["reward"]),
    episode(["CALC: 3*4", "ANSWER: 11"], outcome="answered", feedback=["thumbs"]),  # wrong, thumbs down
    episode(["CALC: three*4", "CALC: 3/0", "CALC: 3*4", "CALC: 12*1"], outcome="timeout", feedback=["outcome"]),
    episode(["CALC: 3*4 apples", "ANSWER: 12"], outcome="answered", correct=True, reward=1.0, feedback=["review"]),
    episode(["I think it is 12"] * 4, outcome="timeout", feedback=["outcome"]),
    episode(["CALC: 3*4", "ANSWER: 12"], outcome="answered", correct=True, reward=1.0),  # never graded
    # Rambling: the second reply is long (over TOKEN_BUDGET), the first exactly at it is not.
    episode(
        ["CALC: 3*4", "ANSWER: 12, because three bags of four make twelve"],
        outcome="answered",
        correct=True,
        reward=1.0,
        feedback=["reward"],
        tokens=[TOKEN_BUDGET, TOKEN_BUDGET + 9],
    ),
    episode(["I think it is 12"] * 4, outcome="timeout", feedback=["outcome"], tokens=[40, 3, 40, 3]),
]


def record(db: Session, project: str, ep: dict[str, Any]) -> None:
    """The calls the proxy recorded for this episode and the feedback the harness posted."""
    transcript, parent, last = ep["transcript"], None, None
    replies = iter(ep["reply_tokens"])
    for i, message in enumerate(transcript):
        if message["role"] != "assistant" or i < len(OPEN):  # the few-shot example is prompt, not replies
            continue
        last = f"{ep['session_id']}-{i}"
        ids = list(range(100, 99 + next(replies))) + [2]  # the reply's sampled tokens (no loop), its end token
        insert(
            db,
            row(
                last,
                [1, 2, 3],
                [choice(ids, content=message["content"])],
                messages=transcript[:i],
                parent=parent,
                session=ep["session_id"],
                project=project,
                at=i,
            ),
        )
        parent = last
    names = {"reward": ep["reward"], "outcome": "timeout", "review": None}
    for name in ep["feedback"]:
        if name == "thumbs":
            db.add(feedback_row(project, "thumbs", ep["correct"], completion=last, session=ep["session_id"]))
        else:
            comment = "a review" if name == "review" else None
            db.add(feedback_row(project, name, names[name], session=ep["session_id"], comment=comment))


def test_mine_counts_what_the_episodes_file_counts(db: Session) -> None:
    project = new_project(db, {"mine": MINE_SETTINGS})
    for ep in EPISODES:
        record(db, project, ep)
    db.commit()
    mine(db, project, settle_s=30)
    found = {mode: m["count"] for mode, m in report(db, project)["modes"].items()}
    direct = dict(count_failures(EPISODES))
    assert direct == {"timeout": 3, "low_grade": 3, "protocol_unparsed": 3, "tool_error": 4, "long_answer": 3}
    assert found == direct
