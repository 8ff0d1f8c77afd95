"""What the dashboard (/ui) reads: pages of calls and sessions, headline counts, one session's turns.

Every query is scoped to one project; lists are newest first with keyset cursors
(a page continues after the ``(time, id)`` of the row named by ``before``), so a page costs the same at row 100,000 as
at row 50. The learning and health figures are in :mod:`storage.dashboard_learning`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, String, and_, cast, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.grading import RewardRule
from storage.mining import MODES
from storage.models import Alias, Completion, CompletionFlag, Feedback, Session

CUT_SHORT = ("client_disconnected", "timeout", "upstream_error", "rejected")
FLAGS = ("error", "cut_short", "stream", "ambiguous_link", "linked")
GRADES = ("graded", "ungraded")
COUNT_CAP = 1_000


class FilterError(ValueError):
    """A filter value the dashboard does not know; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CallFilter:
    """The traffic list's filters; None means any."""

    alias: str | None = None
    version: str | None = None  # an adapter version ("3") or "base"
    tag: str | None = None
    dialect: str | None = None
    termination: str | None = None
    flag: str | None = None  # one of FLAGS
    grade: str | None = None  # one of GRADES
    session_id: str | None = None
    mined: str | None = None  # a failure mode `onthejob mine` flagged (storage.mining.MODES)

    def where(self, project_id: str) -> list[ColumnElement[bool]]:
        """The SQL conditions (raises FilterError naming a bad value)."""
        c = Completion
        out: list[ColumnElement[bool]] = [c.project_id == project_id]
        if self.alias:
            out.append(c.alias == self.alias)
        if self.version:
            if self.version == "base":
                out.append(c.adapter_version.is_(None))
            elif self.version.isdigit():
                out.append(c.adapter_version == int(self.version))
            else:
                raise FilterError("version: an adapter version number, or 'base'", "version")
        if self.tag:
            out.append(cast(c.tags, String).like(f"%{_json_text(self.tag)}%"))
        if self.dialect:
            out.append(c.dialect == self.dialect)
        if self.termination:
            out.append(c.termination == self.termination)
        if self.session_id:
            out.append(c.session_id == self.session_id)
        if self.flag:
            out.append(_flag(self.flag, project_id))
        if self.mined:
            f = CompletionFlag
            out.append(exists().where(f.project_id == project_id, f.completion_id == c.id, f.mode == self.mined))
        if self.grade:
            if self.grade not in GRADES:
                raise FilterError(f"grade: one of {', '.join(GRADES)}", "grade")
            graded = _graded(project_id)
            out.append(graded if self.grade == "graded" else ~graded)
        return out


def _json_text(tag: str) -> str:
    """How a tag appears inside the stored JSON list (quoted; LIKE's wildcards escaped away)."""
    return json.dumps(tag).replace("%", "_").replace("\\", "_")


def _flag(flag: str, project_id: str) -> ColumnElement[bool]:
    c = Completion
    if flag == "error":
        return c.status_code >= 400
    if flag == "cut_short":
        return c.termination.in_(CUT_SHORT)
    if flag == "stream":
        return c.stream.is_(True)
    if flag == "linked":
        return c.parent_id.is_not(None)
    if flag == "ambiguous_link":
        return exists().where(
            Session.project_id == project_id, Session.id == c.session_id, Session.source == "ambiguous_link"
        )
    raise FilterError(f"flag: one of {', '.join(FLAGS)}", "flag")


def _graded(project_id: str) -> ColumnElement[bool]:
    """Some feedback names this call or its session (attached or not is the recorder's business).

    Correlated EXISTS, probed per row: every query it is in stops early (a page, a capped count), and
    two IN lists hashed over all of the project's feedback measured slower at 100,000 calls.
    """
    on_call = exists().where(Feedback.project_id == project_id, Feedback.completion_id == Completion.id)
    on_session = exists().where(
        Feedback.project_id == project_id,
        Feedback.session_id == Completion.session_id,
        Feedback.completion_id.is_(None),
    )
    return or_(on_call, on_session)


class UnknownCursor(LookupError):
    """``before`` names no row of this project (a cursor is the last id of the previous page)."""


def _scalar(rule: RewardRule, fb: Any) -> float | str | None:
    score = rule.score(fb.name, fb.value, fb.comment)
    return score if score is None or isinstance(score, float) else "masked"


async def calls_page(
    db: AsyncSession, project_id: str, flt: CallFilter, rule: RewardRule, *, before: str | None, limit: int
) -> dict[str, Any]:
    """One page of calls, newest first, with how many match in all and each call's newest grade."""
    where = flt.where(project_id)
    # Counted up to COUNT_CAP: a filter on tags, flags or grades reads each call's row, and past a
    # few thousand the exact figure costs more than the page (the unfiltered total is in the overview).
    matching = select(Completion.id).where(*where).limit(COUNT_CAP + 1).subquery()
    total = int(await db.scalar(select(func.count()).select_from(matching)) or 0)
    page_where = list(where)
    if before:
        at = await db.scalar(
            select(Completion.created_at).where(Completion.project_id == project_id, Completion.id == before)
        )
        if at is None:
            raise UnknownCursor(before)
        page_where.append(or_(Completion.created_at < at, and_(Completion.created_at == at, Completion.id < before)))
    cols = (
        Completion.id,
        Completion.created_at,
        Completion.session_id,
        Completion.alias,
        Completion.adapter_version,
        Completion.dialect,
        Completion.endpoint,
        Completion.termination,
        Completion.status_code,
        Completion.tags,
        Completion.usage,
        Completion.latency_ms,
        Completion.stream,
        Completion.parent_id,
    )
    stmt = select(*cols).where(*page_where).order_by(Completion.created_at.desc(), Completion.id.desc())
    rows = (await db.execute(stmt.limit(limit + 1))).all()
    more = len(rows) > limit
    rows = rows[:limit]
    grades = await _grades(db, project_id, rule, [r.id for r in rows], {r.session_id for r in rows})
    data = []
    for r in rows:
        usage = r.usage or {}
        mine = grades.get(f"c:{r.id}", []) + grades.get(f"s:{r.session_id}", [])
        scored = [g for g in mine if g[1] is not None]
        data.append(
            {
                "id": r.id,
                "created_at": r.created_at.isoformat(),
                "session_id": r.session_id,
                "alias": r.alias,
                "adapter_version": r.adapter_version,
                "dialect": r.dialect,
                "endpoint": r.endpoint,
                "termination": r.termination,
                "status_code": r.status_code,
                "tags": r.tags,
                "stream": r.stream,
                "linked": r.parent_id is not None,
                "latency_ms": r.latency_ms,
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens"),
                "feedback": len(mine),
                "grade": max(scored, key=lambda g: g[0])[1] if scored else None,
            }
        )
    last = rows[-1] if rows else None
    return {
        "object": "list",
        "total": min(total, COUNT_CAP),
        "total_capped": total > COUNT_CAP,
        "data": data,
        "has_more": more,
        "next_cursor": last.id if more and last is not None else None,
    }


async def _grades(
    db: AsyncSession, project_id: str, rule: RewardRule, call_ids: Sequence[str], session_ids: set[str]
) -> dict[str, list[tuple[datetime, float | str | None]]]:
    """Per ``c:<call id>`` and ``s:<session id>``, the feedback naming it as (time, scalar by the rule)."""
    if not call_ids:
        return {}
    cond = or_(
        Feedback.completion_id.in_(list(call_ids)),
        and_(Feedback.completion_id.is_(None), Feedback.session_id.in_(list(session_ids))),
    )
    stmt = select(
        Feedback.completion_id,
        Feedback.session_id,
        Feedback.name,
        Feedback.value,
        Feedback.comment,
        Feedback.created_at,
    ).where(Feedback.project_id == project_id, cond)
    out: dict[str, list[tuple[datetime, float | str | None]]] = {}
    for fb in (await db.execute(stmt)).all():
        key = f"c:{fb.completion_id}" if fb.completion_id else f"s:{fb.session_id}"
        out.setdefault(key, []).append((fb.created_at, _scalar(rule, fb)))
    return out


async def sessions_page(
    db: AsyncSession, project_id: str, *, alias: str | None, tag: str | None, before: str | None, limit: int
) -> dict[str, Any]:
    """One page of sessions, most recently active first, each with its calls, tokens and feedback counted."""
    where: list[ColumnElement[bool]] = [Session.project_id == project_id]
    if alias:
        where.append(
            exists().where(
                Completion.project_id == project_id, Completion.session_id == Session.id, Completion.alias == alias
            )
        )
    if tag:
        where.append(cast(Session.tags, String).like(f"%{_json_text(tag)}%"))
    total = int(await db.scalar(select(func.count()).select_from(Session).where(*where)) or 0)
    if before:
        at = await db.scalar(select(Session.updated_at).where(Session.project_id == project_id, Session.id == before))
        if at is None:
            raise UnknownCursor(before)
        where.append(or_(Session.updated_at < at, and_(Session.updated_at == at, Session.id < before)))
    stmt = select(Session).where(*where).order_by(Session.updated_at.desc(), Session.id.desc()).limit(limit + 1)
    rows = list((await db.scalars(stmt)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    ids = [s.id for s in rows]
    counts: dict[str, Any] = {}
    if ids:
        agg = (
            select(
                Completion.session_id, func.count(), func.max(Completion.alias), func.max(Completion.adapter_version)
            )
            .where(Completion.project_id == project_id, Completion.session_id.in_(ids))
            .group_by(Completion.session_id)
        )
        counts = {sid: (n, a, v) for sid, n, a, v in (await db.execute(agg)).all()}
        fb = (
            select(Feedback.session_id, func.count())
            .where(Feedback.project_id == project_id, Feedback.session_id.in_(ids))
            .group_by(Feedback.session_id)
        )
        feedback = dict((await db.execute(fb)).tuples().all())
    else:
        feedback = {}
    data = []
    for s in rows:
        n, a, v = counts.get(s.id, (0, None, None))
        data.append(
            {
                "id": s.id,
                "task_id": s.task_id,
                "source": s.source,
                "tags": s.tags,
                "created_at": s.created_at.isoformat(),
                "updated_at": s.updated_at.isoformat(),
                "calls": n,
                "alias": a,
                "adapter_version": v,
                "feedback": feedback.get(s.id, 0),
            }
        )
    last = rows[-1] if rows else None
    return {
        "object": "list",
        "total": total,
        "data": data,
        "has_more": more,
        "next_cursor": last.id if more and last is not None else None,
    }


async def overview(db: AsyncSession, project_id: str) -> dict[str, Any]:
    """Headline counts: calls (by termination), sessions, feedback, and the aliases called."""
    c = Completion
    by_term = dict(
        (
            await db.execute(
                select(c.termination, func.count()).where(c.project_id == project_id).group_by(c.termination)
            )
        )
        .tuples()
        .all()
    )
    sessions = await db.scalar(select(func.count()).select_from(Session).where(Session.project_id == project_id))
    feedback = await db.scalar(select(func.count()).select_from(Feedback).where(Feedback.project_id == project_id))
    return {
        "calls": sum(by_term.values()),
        "sessions": int(sessions or 0),
        "feedback": int(feedback or 0),
        "by_termination": by_term,
        "mined_modes": list(MODES),
        # The project's aliases (a filter may still name a base model called directly): a DISTINCT over
        # the calls read 100,000 index entries for the same few names.
        "aliases": sorted((await db.scalars(select(Alias.name).where(Alias.project_id == project_id))).all()),
    }


def _new_messages(call: Completion, parent: Completion | None) -> list[Any]:
    """The messages this call added to its parent's (all of them for a first call)."""
    messages = (call.request or {}).get("messages")
    if not isinstance(messages, list):
        prompt = (call.request or {}).get("prompt")
        return [{"role": "prompt", "content": prompt}] if prompt is not None else []
    if parent is None:
        return messages
    before = (parent.request or {}).get("messages")
    skip = len(before) + 1 if isinstance(before, list) else 0  # the parent's messages and its reply
    return messages[skip:] if skip <= len(messages) else messages


async def session_turns(db: AsyncSession, project_id: str, session_id: str) -> list[dict[str, Any]] | None:
    """Each call of a session with the messages it added, the tools it offered and what it answered."""
    stmt = (
        select(Completion)
        .where(Completion.project_id == project_id, Completion.session_id == session_id)
        .order_by(Completion.created_at, Completion.id)
        .limit(500)
    )
    calls = list((await db.scalars(stmt)).all())
    if not calls:
        return None
    by_id = {c.id: c for c in calls}
    out = []
    for call in calls:
        tools = (call.request or {}).get("tools") or []
        out.append(
            {
                "id": call.id,
                "created_at": call.created_at.isoformat(),
                "alias": call.alias,
                "adapter_version": call.adapter_version,
                "parent_id": call.parent_id,
                "termination": call.termination,
                "status_code": call.status_code,
                "error": call.error,
                "dialect": call.dialect,
                "tools": [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)],
                "messages": _new_messages(call, by_id.get(call.parent_id or "")),
                "choices": [
                    {
                        "index": ch.get("index", 0),
                        "finish_reason": ch.get("finish_reason"),
                        "message": ch.get("message"),
                        "text": ch.get("text"),
                        "tokens": len(ch.get("token_ids") or []),
                    }
                    for ch in call.choices
                ],
            }
        )
    return out
