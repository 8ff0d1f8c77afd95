"""``onthejob mine`` against the database: flag what changed since the miner's cursor, then report.

A pass reads the change log a page at a time from the cursor ``mine``
(:mod:`storage.changes`): each new call is checked by itself (:func:`storage.mining.call_modes`),
its request's new tool results flag the call that asked for the tool, and each new
feedback item flags the call it grades (the session's last call for a session grade).
Flags are stored per completion (``completion_flags``, one row per mode, never
duplicated) in the transaction that moves the cursor, so a pass interrupted anywhere
resumes without losing or doubling a flag. Memory is one page, whatever the history.

Feedback stored before its call landed is resolved by its target when read; one whose
target has not landed yet is counted as ``unresolved_feedback`` and flags its call when
that call lands (a grade naming a completion; a session grade whose session had no call
yet is not flagged).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.orm import Session as DbSession

from storage.changes import START, among, await_horizon, changes_since, load_cursor, save_cursor
from storage.changes import _resolve_pending as resolve_pending
from storage.db import insert_for
from storage.grading import MASKED
from storage.loaders import rule_for, settings_stmt
from storage.mining import MODES, Found, MineConfig, call_modes, grade_modes, tool_errors
from storage.models import Completion, CompletionFlag, Feedback
from storage.stored_form import is_delta
from storage.stored_read import expand_requests

CONSUMER = "mine"


def expanded(db: DbSession, rows: list[Any]) -> list[Any]:
    """The rows with each request in full (storage/stored_form.py); rows already full as they are."""
    if not any(is_delta(r.request) for r in rows):
        return rows
    full = expand_requests(db.connection(), {r.id: r.request for r in rows})
    return [SimpleNamespace(**{**r._mapping, "request": full[r.id]}) for r in rows]


_CALL_COLUMNS = (
    Completion.id,
    Completion.session_id,
    Completion.alias,
    Completion.adapter_version,
    Completion.termination,
    Completion.status_code,
    Completion.request,
    Completion.choices,
    Completion.parent_id,
)


@dataclass
class MinePass:
    """What one pass read and flagged."""

    calls: int = 0
    feedback: int = 0
    unresolved_feedback: int = 0
    flagged: Counter[str] = field(default_factory=Counter)
    cleared: int = 0  # low_grade flags removed: the call's grade was revised upward


def mine(db: DbSession, project: str, *, page: int = 2000, settle_s: float = 10.0) -> MinePass:
    """Flag everything that changed since the miner's cursor (the whole log, page by page).

    ``settle_s``: how long to wait for calls already committed but held back by an older transaction.
    """
    settings = db.scalar(settings_stmt(project)) or {}
    cfg, rule = MineConfig.from_settings(settings), rule_for(settings)
    cursor = load_cursor(db, project, CONSUMER) or START
    await_horizon(db, project, settle_s)
    out = MinePass()
    while changes := changes_since(db, project, cursor, page):
        found = Found()
        calls = [c.ref_id for c in changes if c.kind == "call"]
        stmt = select(*_CALL_COLUMNS).where(Completion.project_id == project, among(db, Completion.id, calls))
        rows = expanded(db, list(db.execute(stmt)))
        for row in rows:
            found.add(row.id, call_modes(row, cfg))
            if row.parent_id and (errors := tool_errors(row, cfg)):
                found.add(row.parent_id, {"tool_error": {"result": errors[0]}})
        items = [c.ref_id for c in changes if c.kind == "feedback"]
        unresolved, cleared = _grade(db, project, items, cfg, rule, found, calls)
        out.unresolved_feedback, out.cleared = out.unresolved_feedback + unresolved, out.cleared + cleared
        out.calls, out.feedback = out.calls + len(calls), out.feedback + len(items)
        out.flagged += _store(db, project, found)
        cursor = changes[-1].position
        save_cursor(db, project, CONSUMER, cursor)
        db.commit()
    return out


def _grade(
    db: DbSession, project: str, ids: list[str], cfg: MineConfig, rule: Any, found: Found, calls: list[str]
) -> tuple[int, int]:
    """Flag the calls these feedback items grade; returns how many named no landed call, and low grades cleared.

    Grades of the page's new calls are read again too: one stored before its call landed
    was unresolved when the miner first saw it (flags are idempotent: a grade flags once).
    A call a grade lands on has its ``low_grade`` flag decided again from all its current
    grades (:func:`_regrade`), so a grade revised upward clears it.
    """
    stmt = select(Feedback).where(Feedback.project_id == project)
    items = list(db.scalars(stmt.where(among(db, Feedback.id, ids)))) if ids else []
    if calls:
        named = or_(
            among(db, Feedback.completion_id, calls),
            and_(
                Feedback.attached_at.is_(None),
                Feedback.target_kind == "completion_id",
                among(db, Feedback.target_id, calls),
            ),
        )
        items += db.scalars(stmt.where(named, ~among(db, Feedback.id, ids)))
    sessions = dict(resolve_pending(db, project, [f.id for f in items if f.session_id is None]))
    last = _last_calls(db, project, {item.session_id or sessions.get(item.id) for item in items} - {None})
    unresolved, graded = 0, set()
    for item in items:
        scalar = rule.score(item.name, item.value, item.comment)
        modes = grade_modes(item.name, item.value, None if scalar is MASKED else scalar, cfg)
        session = item.session_id or sessions.get(item.id)
        if session is None:
            unresolved += bool(modes)
            continue
        target = item.completion_id or (item.target_id if item.target_kind == "completion_id" else None)
        target = target or last.get(session)
        if target is None:
            continue
        modes.pop("low_grade", None)  # decided per call from its current grades, below
        if modes:
            found.add(target, {mode: {**detail, "feedback_id": item.id} for mode, detail in modes.items()})
        if scalar is not None:
            graded.add(target)
    return unresolved, _regrade(db, project, graded, cfg, rule, found)


def _regrade(db: DbSession, project: str, targets: set[str], cfg: MineConfig, rule: Any, found: Found) -> int:
    """Set, replace or clear each call's ``low_grade`` flag from its current grades; returns how many were cleared.

    A call's grades are the items naming it and, when it is its session's newest call, the
    session's own; per (level, source, name, choice) the newest wins (a revision), as in
    :func:`storage.grading.current`. The newest low winner is the flag's detail. A session
    grade's flag follows the session's newest call.
    """
    if not targets:
        return 0
    sessions = set(
        db.scalars(
            select(Completion.session_id).where(Completion.project_id == project, among(db, Completion.id, targets))
        )
    )
    last = _last_calls(db, project, sessions)
    heads = [session for session, cid in last.items() if cid in targets]
    flags = (CompletionFlag.project_id == project, CompletionFlag.mode == "low_grade")
    # An earlier call of these sessions may hold the flag of a session grade from before it was the last.
    targets = targets | set(
        db.scalars(select(CompletionFlag.completion_id).where(*flags, among(db, CompletionFlag.session_id, heads)))
    )
    where = or_(
        among(db, Feedback.completion_id, targets),
        and_(
            Feedback.attached_at.is_(None),
            Feedback.target_kind == "completion_id",
            among(db, Feedback.target_id, targets),
        ),
        and_(
            Feedback.completion_id.is_(None),
            Feedback.target_kind != "completion_id",
            among(db, Feedback.session_id, heads),
        ),
    )
    winners: dict[tuple[Any, ...], Feedback] = {}
    for item in db.scalars(select(Feedback).where(Feedback.project_id == project, where)):
        on_call = item.completion_id or (item.target_id if item.target_kind == "completion_id" else None)
        cid = on_call or last.get(item.session_id or "")
        key = (cid, on_call is None, item.source, item.name, item.choice)
        if cid in targets and (
            key not in winners or (item.created_at, item.id) > (winners[key].created_at, winners[key].id)
        ):
            winners[key] = item
    low: dict[str, dict[str, Any]] = {}
    for (cid, *_), item in sorted(winners.items(), key=lambda kv: (kv[1].created_at, kv[1].id)):
        scalar = rule.score(item.name, item.value, item.comment)
        if "low_grade" in (modes := grade_modes(item.name, item.value, None if scalar is MASKED else scalar, cfg)):
            low[cid] = {**modes["low_grade"], "feedback_id": item.id}
    stmt = select(CompletionFlag.completion_id, CompletionFlag.detail).where(*flags)
    stored: dict[str, Any] = dict(db.execute(stmt.where(among(db, CompletionFlag.completion_id, targets))).all())
    if stale := [cid for cid, detail in stored.items() if detail != low.get(cid)]:
        db.execute(delete(CompletionFlag).where(*flags, among(db, CompletionFlag.completion_id, stale)))
    for cid, detail in low.items():
        if stored.get(cid) != detail:
            found.add(cid, {"low_grade": detail})
    return sum(cid not in low for cid in stale)


def _last_calls(db: DbSession, project: str, sessions: set[Any]) -> dict[str, str]:
    """Each session's newest call (one query for a page's sessions)."""
    if not sessions:
        return {}
    out: dict[str, tuple[Any, str]] = {}
    stmt = select(Completion.session_id, Completion.created_at, Completion.id).where(
        Completion.project_id == project, among(db, Completion.session_id, sessions)
    )
    for session, created, cid in db.execute(stmt):
        if session not in out or (created, cid) > out[session]:
            out[session] = (created, cid)
    return {session: cid for session, (_, cid) in out.items()}


def _store(db: DbSession, project: str, found: Found) -> Counter[str]:
    """Insert the flags (one per completion and mode; a flag already stored stays as it is)."""
    if not found.flags:
        return Counter()
    calls = {
        r.id: r
        for r in db.execute(
            select(Completion.id, Completion.session_id, Completion.alias, Completion.adapter_version).where(
                Completion.project_id == project, among(db, Completion.id, found.flags)
            )
        )
    }
    rows = [
        {
            "project_id": project,
            "completion_id": cid,
            "session_id": calls[cid].session_id,
            "alias": calls[cid].alias,
            "adapter_version": calls[cid].adapter_version,
            "mode": mode,
            "detail": detail,
        }
        for cid, modes in found.flags.items()
        if cid in calls
        for mode, detail in modes.items()
    ]
    if not rows:
        return Counter()
    dialect = db.get_bind().dialect.name
    insert = insert_for(dialect)
    stmt = insert(CompletionFlag).on_conflict_do_nothing().returning(CompletionFlag.mode)
    return Counter(db.scalars(stmt, rows))


# --------------------------------------------------------------------------- the report


def report(
    db: DbSession, project: str, *, alias: str | None = None, since: datetime | None = None, examples: int = 3
) -> dict[str, Any]:
    """Counts, shares and examples per mode, per adapter version (None: the base model), oldest version first."""
    where = [Completion.project_id == project]
    if alias is not None:
        where.append(Completion.alias == alias)
    if since is not None:
        where.append(Completion.created_at >= since)
    totals = dict(
        db.execute(
            select(Completion.adapter_version, func.count()).where(*where).group_by(Completion.adapter_version)
        ).all()
    )
    counts = db.execute(
        select(CompletionFlag.adapter_version, CompletionFlag.mode, func.count())
        .join(Completion, Completion.id == CompletionFlag.completion_id)
        .where(CompletionFlag.project_id == project, *where)
        .group_by(CompletionFlag.adapter_version, CompletionFlag.mode)
    ).all()
    versions: dict[Any, dict[str, Any]] = {v: {"calls": n, "modes": {}} for v, n in totals.items()}
    for version, mode, n in counts:
        entry = versions.setdefault(version, {"calls": 0, "modes": {}})
        entry["modes"][mode] = {"count": n, "share": n / entry["calls"] if entry["calls"] else None}
    calls = sum(totals.values())
    modes: dict[str, Any] = {}
    for mode in MODES:
        n = sum(v["modes"].get(mode, {}).get("count", 0) for v in versions.values())
        if n:
            modes[mode] = {
                "count": n,
                "share": n / calls if calls else None,
                "examples": _examples(db, project, mode, where, examples),
            }
    order = sorted(versions, key=lambda v: -1 if v is None else v)
    return {
        "project": project,
        "alias": alias,
        "since": since.isoformat() if since else None,
        "calls": calls,
        "modes": modes,
        "versions": [{"version": v, **versions[v]} for v in order],
    }


def _examples(db: DbSession, project: str, mode: str, where: Iterable[Any], n: int) -> list[dict[str, Any]]:
    rows = db.execute(
        select(CompletionFlag.session_id, CompletionFlag.completion_id, CompletionFlag.detail)
        .join(Completion, Completion.id == CompletionFlag.completion_id)
        .where(CompletionFlag.project_id == project, CompletionFlag.mode == mode, *where)
        .order_by(CompletionFlag.id.desc())
        .limit(n)
    )
    return [{"session_id": s, "completion_id": c, "detail": d} for s, c, d in rows]
