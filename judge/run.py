"""One pass of the judge process: calibrate on the labelled sessions, judge the rest, post the grades.

``onthejob judge [--watch]`` calls :func:`judge_once` in a loop. The database is
read (and a calibration row written) directly, as the trainer does; grades go
through the proxy's ``POST /v1/feedback`` like any grader's, so they are
validated, attached, revisable and visible by the same API.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session as DbSession

from judge.baseline import keyword_score
from judge.calibrate import Agreement, agreement, gate
from judge.errors import JudgeError
from judge.post import feedback_items
from judge.score import Completer, calibrate, judge_items
from judge.select import select_items
from storage.judge_config import JudgeSettings, Verdict, implicit_feedback, parse_judge_settings
from storage.judge_store import record_calibration
from storage.loaders import settings_stmt

Poster = Callable[[Sequence[dict[str, Any]]], Awaitable[int]]


@dataclass
class Report:
    """What one pass did; printed by the CLI, asserted by tests."""

    fingerprint: str
    agreement: Agreement | None = None
    baseline: Agreement | None = None  # the keyword scorer on the labelled sessions that carry a comment
    verdict: Verdict | None = None
    judged: int = 0
    unreadable: int = 0
    posted: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "agreement": self.agreement.to_dict() if self.agreement else None,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "accepted": self.verdict.accepted if self.verdict else None,
            "gate": self.verdict.detail if self.verdict else None,
            "judged": self.judged,
            "unreadable": self.unreadable,
            "posted": self.posted,
            "skipped": dict(self.skipped),
        }


def project_judge(db: DbSession, project_id: str) -> tuple[JudgeSettings, dict[str, Any]]:
    """The project's judge settings (and all its settings); an error that says how to set them."""
    settings = db.scalar(settings_stmt(project_id)) or {}
    cfg = parse_judge_settings(settings.get("judge"))
    if cfg is None:
        raise JudgeError(
            f'project {project_id!r} has no judge: PUT /v1/admin/project {{"judge": {{"rubric": "..."}}}} first'
        )
    return cfg, settings


def baseline_agreement(cfg: JudgeSettings, labelled: Sequence[Any]) -> Agreement | None:
    """The keyword scorer on the labelled sessions with a comment, on the same scale and threshold."""
    with_comment = [i for i in labelled if i.comment]
    if not with_comment:
        return None
    low, high = cfg.scale
    scores = [None if (k := keyword_score(i.comment)) is None else low + k * (high - low) for i in with_comment]
    return agreement(scores, [float(i.label) for i in with_comment], cfg.decision_threshold)


async def judge_once(
    db: DbSession,
    project_id: str,
    client: Completer,
    post: Poster,
    *,
    alias: str | None = None,
    calibrate_first: bool = True,
    dry_run: bool = False,
) -> Report:
    """Calibrate (when asked and labelled sessions exist), judge what is pending, post the readable grades."""
    cfg, settings = project_judge(db, project_id)
    selection = select_items(db, project_id, cfg, alias=alias, settings=settings)
    report = Report(cfg.fingerprint(), skipped=selection.skipped)
    if calibrate_first and selection.labelled:
        report.agreement = await calibrate(client, cfg, selection.labelled)
        report.baseline = baseline_agreement(cfg, selection.labelled)
        a = report.agreement
        record_calibration(
            db,
            project_id,
            cfg,
            n=a.n,
            unreadable=a.unreadable,
            spearman=a.spearman,
            accuracy=a.accuracy,
            threshold=a.threshold,
            baseline=report.baseline.to_dict() if report.baseline else None,
        )
        db.commit()
    report.verdict = gate(report.agreement, cfg.min_agreement, cfg.min_labelled) if report.agreement else None
    judged = await judge_items(client, cfg, selection.to_judge, implicit=implicit_feedback(settings))
    report.judged = len(judged)
    report.unreadable = sum(1 for j in judged if j.score is None)
    items = feedback_items(judged, cfg.fingerprint(), cfg.mode)
    if items and not dry_run:
        report.posted = await post(items)
    return report
