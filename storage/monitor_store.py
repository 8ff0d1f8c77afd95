"""The monitors' database side: read an alias's windows, compare versions, raise alerts.

What a session contributes is in ``storage.monitors`` (pure); here: which sessions form each
version's window (the newest ``window_sessions`` settled ones whose last call that version
served, eval and judge traffic left out), what each call says (tokens, tool calls, tool
results matching the project's error patterns, terminations), and the feedback the reward
rule reads. One pass (:func:`run_monitors`) per alias: windows, baselines, alerts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.alerts import raise_alert
from storage.grading import JUDGE_TAG, Grade, RewardRule, current, is_graded, resolve_grades, resolve_reward
from storage.loaders import feedback_stmt, project_rule_async
from storage.models import Alias, Completion, Project
from storage.monitors import (
    Breach,
    Estimate,
    MonitorConfig,
    SessionStats,
    baselines,
    compare,
    parse_config,
    window,
)
from storage.trajectories import Trajectory, Turn

SKIP_TAGS = {"eval", JUDGE_TAG}  # held-out and judge traffic say nothing about what users get
CUT = {"timeout", "client_disconnected"}  # terminations the proxy saw: the attempt was cut short
CUT_OUTCOMES = {"timeout", "abort"}
VERSIONS_WATCHED = 10  # the newest versions with traffic (and their baselines) each pass


def monitor_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """A project's ``settings["monitors"]``: ``tool_error_patterns`` and per-alias overrides under ``aliases``."""
    value = (settings or {}).get("monitors")
    return dict(value) if isinstance(value, Mapping) else {}


def config_for(settings: Mapping[str, Any] | None, alias: str) -> MonitorConfig:
    """The monitor configuration of one alias from its project's settings."""
    mon = monitor_settings(settings)
    patterns = mon.get("tool_error_patterns")
    return parse_config((mon.get("aliases") or {}).get(alias), patterns)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def new_tool_results(request: Mapping[str, Any]) -> list[str]:
    """The tool results a call's request adds: ``tool`` messages after its last assistant message."""
    messages = request.get("messages") or []
    out: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role") == "assistant":
            break
        if message.get("role") == "tool":
            out.append(_text(message.get("content")))
    return out[::-1]


def tool_calls_of(choices: Sequence[Mapping[str, Any]]) -> float:
    """Tool calls the reply made (the mean over choices, for n > 1)."""
    if not choices:
        return 0.0
    counts = [len((c.get("message") or {}).get("tool_calls") or ()) for c in choices]
    return sum(counts) / len(counts)


def tokens_of(call: Completion) -> int:
    usage = call.usage or {}
    if isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return sum(len(c.get("token_ids") or ()) for c in call.choices)


def session_stats(
    calls: Sequence[Completion], grades: Sequence[Grade], rule: RewardRule, patterns: Sequence[re.Pattern[str]]
) -> SessionStats:
    """One session's figures from its calls (in time order) and its current grades.

    Tool calls: those the replies made, or the tool results the harness sent back if more (a
    model whose tool calls are plain text, ReAct style, makes none the proxy can parse, yet each
    result arrives as a ``tool`` message; a session cut short made calls nobody answered).
    """
    last = calls[-1]
    results = [text for c in calls for text in new_tool_results(c.request or {})]
    matched = sum(any(p.search(text) for p in patterns) for text in results)
    mine = current(grades)
    scored = [(g, rule.score(g.name, g.value, g.comment)) for g in mine]
    infra = sum(g.name == "outcome" and g.value == "infra_error" for g in mine)
    cut_outcome = any(g.name == "outcome" and g.value in CUT_OUTCOMES for g in mine)
    # The reward rule applied to the session as one branch (its calls in order): the same scalar
    # a linear session's trajectory gets in training.
    branch = Trajectory(
        id=last.id,
        project_id=last.project_id,
        session_id=last.session_id,
        task_id=last.task_id,
        alias=last.alias,
        token_ids=[],
        mask=[],
        logprobs=[],
        completion_ids=[c.id for c in calls],
        turns=[Turn(c.id, 0, 0, 0, c.adapter_version, c.served_model, {}) for c in calls],
        flags=sorted({c.termination for c in calls}),
    )
    reward, _ = resolve_reward(branch, list(grades), rule)
    judged = [s for g, s in scored if g.source == rule.judge_source and isinstance(s, float)]
    ended = last.created_at if last.created_at.tzinfo else last.created_at.replace(tzinfo=UTC)
    return SessionStats(
        session_id=last.session_id,
        version=last.adapter_version,
        ended_at=ended.timestamp(),
        calls=len(calls),
        completion_tokens=sum(tokens_of(c) for c in calls),
        answer_tokens=tokens_of(last),
        tool_calls=max(round(sum(tool_calls_of(c.choices) for c in calls)), len(results)),
        tool_results=len(results),
        tool_errors=matched + infra,
        timed_out=cut_outcome or any(c.termination in CUT for c in calls),
        graded=is_graded(grades, rule),
        reward=reward,
        judge=sum(judged) / len(judged) if judged else None,
    )


async def _window_sessions(
    db: AsyncSession, project_id: str, alias: str, version: int | None, config: MonitorConfig, now: datetime
) -> list[str]:
    ended = func.max(Completion.created_at)
    query = (
        select(Completion.session_id)
        .where(
            Completion.project_id == project_id,
            Completion.alias == alias,
            Completion.adapter_version.is_(None) if version is None else Completion.adapter_version == version,
        )
        .group_by(Completion.session_id)
        .having(ended <= now - timedelta(seconds=config.settle_s))
        .order_by(ended.desc())
        .limit(config.window_sessions)
    )
    return list((await db.scalars(query)).all())


async def load_window(
    db: AsyncSession,
    project_id: str,
    alias: str,
    version: int | None,
    config: MonitorConfig,
    rule: RewardRule,
    now: datetime | None = None,
) -> list[SessionStats]:
    """The settled sessions of one version's window, newest first (eval and judge traffic left out)."""
    now = now or datetime.now(UTC)
    ids = await _window_sessions(db, project_id, alias, version, config, now)
    if not ids:
        return []
    sessions = select(Completion.session_id).where(Completion.project_id == project_id, Completion.session_id.in_(ids))
    rows = (
        await db.scalars(
            select(Completion)
            .where(Completion.project_id == project_id, Completion.session_id.in_(ids))
            .order_by(Completion.created_at, Completion.id)
        )
    ).all()
    by_session: dict[str, list[Completion]] = {}
    for row in rows:
        by_session.setdefault(row.session_id, []).append(row)
    grades: dict[str | None, list[Grade]] = {}
    for g in resolve_grades((await db.scalars(feedback_stmt(project_id, sessions.distinct()))).all(), rows):
        grades.setdefault(g.session_id, []).append(g)
    patterns = [re.compile(p) for p in config.tool_error_patterns]
    out = []
    for sid in ids:
        calls = by_session.get(sid) or []
        if not calls or calls[-1].adapter_version != version or any(SKIP_TAGS & set(c.tags or ()) for c in calls):
            continue
        out.append(session_stats(calls, grades.get(sid, []), rule, patterns))
    return out


@dataclass
class AliasReport:
    """One pass over an alias: each version's window, and what breached against which baseline."""

    alias: str
    windows: dict[int | None, dict[str, Estimate]]
    breaches: dict[int | None, list[Breach]]
    opened: list[int] = field(default_factory=list)  # ids of alerts this pass opened

    def to_dict(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "versions": [
                {
                    "version": v,
                    "window": {k: e.to_dict() for k, e in w.items()},
                    "breaches": [vars(b) for b in self.breaches.get(v, [])],
                }
                for v, w in self.windows.items()
            ],
        }


async def versions_with_traffic(db: AsyncSession, project_id: str, alias: str) -> list[int | None]:
    rows = await db.scalars(
        select(Completion.adapter_version)
        .where(Completion.project_id == project_id, Completion.alias == alias)
        .distinct()
    )
    return sorted(set(rows.all()), key=lambda v: -1 if v is None else v)


async def run_monitors(
    db: AsyncSession,
    project_id: str,
    alias: str,
    *,
    now: datetime | None = None,
    extra: Mapping[int | None, Mapping[str, Estimate]] | None = None,
    raise_alerts: bool = True,
) -> AliasReport:
    """Compute every watched version's window, compare with its baselines, raise (or refresh) alerts.

    ``extra``: per version, estimates measured outside the records (``kl_base`` from the drift
    probe). The caller commits.
    """
    settings = await db.scalar(select(Project.settings).where(Project.id == project_id))
    config = config_for(settings, alias)
    rule = await project_rule_async(db, project_id)
    versions = await versions_with_traffic(db, project_id, alias)
    watched = set(versions[-VERSIONS_WATCHED:])
    pinned = config.reference_version
    candidates = [v for v in versions if v in watched or v == (None if pinned == "base" else pinned)]
    windows: dict[int | None, dict[str, Estimate]] = {}
    full: dict[int | None, bool] = {}
    for v in candidates:
        sessions = await load_window(db, project_id, alias, v, config, rule, now)
        windows[v] = window(sessions, (extra or {}).get(v))
        full[v] = len(sessions) >= config.min_sessions
    if pinned is None:  # the default reference: the oldest full window, maybe older than the watched ones
        for v in (v for v in versions if v not in windows):
            sessions = await load_window(db, project_id, alias, v, config, rule, now)
            if len(sessions) >= config.min_sessions:
                windows[v], full[v] = window(sessions, (extra or {}).get(v)), True
                break
    report = AliasReport(alias, dict(sorted(windows.items(), key=lambda kv: -1 if kv[0] is None else kv[0])), {})
    for v, pairs in baselines(list(windows), full, config).items():
        found: dict[str, Breach] = {}
        for base_version, against in pairs:
            for b in compare(windows[v], windows[base_version], config, base_version, against):
                found.setdefault(b.monitor, b)  # the predecessor's comparison first
        report.breaches[v] = list(found.values())
        if not raise_alerts or v is None:
            continue
        for b in found.values():
            row, new = await raise_alert(
                db,
                project_id,
                alias,
                v,
                "monitor",
                b.monitor,
                message=b.message(v),
                value=b.value,
                baseline=b.baseline,
                threshold=b.limit,
                baseline_version=b.baseline_version,
                detail={"against": b.against, "change": b.change, "z": b.z, "window": windows[v][b.monitor].to_dict()},
            )
            if new:
                await db.flush()
                report.opened.append(row.id)
    return report


async def monitored_aliases(db: AsyncSession, project_id: str | None = None) -> list[tuple[str, str]]:
    """Every (project, alias) the monitors watch."""
    query = select(Alias.project_id, Alias.name)
    if project_id is not None:
        query = query.where(Alias.project_id == project_id)
    return [(p, a) for p, a in (await db.execute(query.order_by(Alias.project_id, Alias.name))).all()]
