"""What the judge reads from storage: sessions to judge, and the labelled sessions that calibrate it.

Per session, its last call is what gets judged: the request's messages plus the
reply (stored records only; nothing re-runs the harness). Grades are resolved
by the project's reward rule over feedback from every source but the judge
itself, so the judge never calibrates against, or skips because of, its own
grades. A session is

* **labelled** when it has such a grade and a calibration tag (``eval`` by default);
* **to judge** when it has no grade and is not held out: with a comment (read
  with the conversation) when ``comments`` is on, with none (self-evaluation)
  when ``self_evaluation`` is on;
* otherwise skipped, counted by reason. The judge's own calls (tagged ``judge``)
  are never judged, and a session already judged under this configuration and
  comment is not judged again.

With the project's ``implicit_feedback`` on, the user's next message after an
answer stands in for a comment where there is none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session as DbSession

from judge.post import judge_key
from judge.score import Item
from storage.grading import current, resolve_grades
from storage.hindsight import next_turn_feedback
from storage.judge_config import JUDGE_SOURCE, JUDGE_TAG, JudgeSettings, implicit_feedback, implicit_skip
from storage.loaders import (
    build,
    completions_stmt,
    feedback_stmt,
    rule_for,
    sessions_subquery,
    settings_stmt,
)
from storage.trajectories import Trajectory, trajectory_id

GRADED = "graded"
HELD_OUT = "eval"
JUDGE_CALL = "judge_call"
NO_TEXT = "no_text"
ALREADY_JUDGED = "already_judged"
COMMENTS_OFF = "comments_off"
SELF_EVALUATION_OFF = "self_evaluation_off"


@dataclass
class Selection:
    """Sessions to judge, labelled sessions to calibrate on, and the rest counted by reason."""

    to_judge: list[Item] = field(default_factory=list)
    labelled: list[Item] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def conversation_of(call: Any) -> list[dict[str, Any]] | None:
    """The judged conversation of one stored call (first choice), or None when no text was stored."""
    request = call.request or {}
    first = (call.choices or [{}])[0] or {}
    if call.endpoint == "completions":
        prompt, text = request.get("prompt"), first.get("text")
        if not isinstance(prompt, str) or text is None:
            return None
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
    messages = request.get("messages")
    reply = first.get("message")
    if not isinstance(messages, list) or not isinstance(reply, dict):
        return None
    return [dict(m) for m in messages if isinstance(m, dict)] + [dict(reply)]


def _comment(grades: Sequence[Any]) -> str | None:
    texts = [g.comment.strip() for g in grades if g.comment and g.comment.strip()]
    return "\n".join(texts) if texts else None


def select_items(
    db: DbSession,
    project_id: str,
    cfg: JudgeSettings,
    *,
    alias: str | None = None,
    since: datetime | None = None,
    settings: dict[str, Any] | None = None,
) -> Selection:
    """Read the project's sessions (of ``alias``, since a time) and sort them for the judge."""
    if settings is None:
        settings = db.scalar(settings_stmt(project_id)) or {}
    sessions = sessions_subquery(project_id, alias=alias, since=since)
    completions = list(db.scalars(completions_stmt(project_id, sessions)))
    feedback = list(db.scalars(feedback_stmt(project_id, sessions)))
    others = [f for f in feedback if f.source != JUDGE_SOURCE]
    judged_keys = {f.idempotency_key for f in feedback if f.source == JUDGE_SOURCE}
    trajectories = build(completions, others, rule=rule_for(settings))
    grades = resolve_grades(others, completions)
    hindsight: dict[str, list[str]] = {}
    if implicit_feedback(settings):
        for h in next_turn_feedback(completions, implicit_skip(settings)):
            hindsight.setdefault(h.session_id, []).append(h.text)
    return sort_sessions(completions, trajectories, grades, cfg, judged_keys, hindsight)


def sort_sessions(
    completions: Sequence[Any],
    trajectories: Sequence[Trajectory],
    grades: Sequence[Any],
    cfg: JudgeSettings,
    judged_keys: Collection[str] = (),
    hindsight: Mapping[str, Sequence[str]] | None = None,
) -> Selection:
    """The pure part of :func:`select_items`: completions in session and time order, graded trajectories.

    ``hindsight``: per session, the user's next messages after answers (implicit feedback, when the
    project turns it on), read as the comment of a session that has no explicit one.
    """
    last: dict[str, Any] = {}
    tags: dict[str, set[str]] = {}
    for c in completions:
        last[c.session_id] = c
        tags.setdefault(c.session_id, set()).update(str(t) for t in (c.tags or ()))
    by_id = {t.id: t for t in trajectories}
    by_session: dict[str, list[Any]] = {}
    for g in current(grades):
        if g.session_id is not None:
            by_session.setdefault(g.session_id, []).append(g)
    fingerprint = cfg.fingerprint()
    out = Selection()
    for session_id, call in last.items():
        traj = by_id.get(trajectory_id(call.id, 0))
        session_tags = tags[session_id] | set(traj.tags if traj else ())
        if JUDGE_TAG in session_tags:
            out.skipped[JUDGE_CALL] += 1
            continue
        conversation = conversation_of(call)
        if conversation is None:
            out.skipped[NO_TEXT] += 1
            continue
        comment = _comment(by_session.get(session_id, []))
        if comment is None and hindsight and hindsight.get(session_id):
            comment = "\n".join(hindsight[session_id])
        reward = traj.reward if traj is not None else None
        item = Item(session_id, conversation, comment, call.task_id, reward, call.id)
        if reward is not None or (traj is not None and traj.reward_detail.get("excluded") == "infra_error"):
            if reward is not None and session_tags & set(cfg.calibration_tags):
                out.labelled.append(item)
            out.skipped[GRADED] += 1
        elif HELD_OUT in session_tags:
            out.skipped[HELD_OUT] += 1
        elif comment is None and not cfg.self_evaluation:
            out.skipped[SELF_EVALUATION_OFF] += 1
        elif comment is not None and not cfg.comments:
            out.skipped[COMMENTS_OFF] += 1
        elif judge_key(fingerprint, session_id, comment) in judged_keys:
            out.skipped[ALREADY_JUDGED] += 1
        else:
            out.to_judge.append(item)
    return out
