"""Retention: each project keeps its raw calls ``retention_days`` days (``settings["retention_days"]``; unset: forever).

A pass deletes, per project, the calls older than that with the feedback about them,
their failure flags and change-log entries; then the sessions left with no call and no
activity since the cutoff, with their session-level feedback; then pending feedback
whose target never landed in that time. Lineage stays (``used_feedback`` and the
training steps hold ids, no content): an adapter still says what trained it.

No tombstones: a call older than the cutoff still in a spool when the pass ran lands
later and goes at the next pass (retention is a period, not a promise to the second).
A session whose older calls went and newer ones stayed keeps them; its trajectories
start at the oldest call left. The housekeeper (storage/housekeep.py: ``onthejob housekeep``, or a
thread of each proxy worker) runs a pass every ``ONTHEJOB_RETENTION_EVERY`` seconds; ``onthejob
retention`` runs one by hand.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, select
from sqlalchemy.orm import Session as DbSession

from storage.deletion import delete_records, deleted_count
from storage.models import Change, Completion, Feedback, Project, Session, utcnow
from storage.stored_read import release_prefixes, rewrite_children_in_full

BATCH = 2000  # rows per transaction: a long backlog never holds one huge transaction


def retention_days(settings: dict[str, Any] | None) -> int | None:
    """The project's retention in days, or None (keep forever)."""
    value = (settings or {}).get("retention_days")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def apply_retention(db: DbSession, *, now: datetime | None = None, batch: int = BATCH) -> dict[str, dict[str, int]]:
    """One pass over every project with a retention; what it deleted, per project. Commits per batch."""
    now = now or utcnow()
    out: dict[str, dict[str, int]] = {}
    for project, settings in db.execute(select(Project.id, Project.settings)).all():
        days = retention_days(settings)
        if days is not None:
            out[project] = expire(db, project, now - timedelta(days=days), batch=batch)
    return out


def expire(db: DbSession, project: str, cutoff: datetime, *, batch: int = BATCH) -> dict[str, int]:
    """Delete the project's calls made before ``cutoff`` and what only they held; counts. Commits per batch."""
    done = {"calls": 0, "feedback": 0, "sessions": 0}
    old_calls = select(Completion.id).where(Completion.project_id == project, Completion.created_at < cutoff)
    # FOR UPDATE (Postgres): a recorder inserting a delta of one of these holds it FOR KEY SHARE, so either
    # it commits first and the rewrite below sees its row, or it waits and finds its parent gone.
    while calls := list(db.scalars(old_calls.limit(batch).with_for_update())):
        done["feedback"] += delete_records(db, project, calls, [])
        rewrite_children_in_full(db, project, calls)  # a kept call stored as a delta of one of these
        release_prefixes(db, project, calls)  # and the shared prefixes these reference
        drop_calls = delete(Completion).where(Completion.project_id == project, Completion.id.in_(calls))
        done["calls"] += deleted_count(db.execute(drop_calls))
        db.commit()
    has_calls = exists().where(Completion.project_id == project, Completion.session_id == Session.id)
    idle_sessions = select(Session.id).where(Session.project_id == project, Session.updated_at < cutoff, ~has_calls)
    while sessions := list(db.scalars(idle_sessions.limit(batch))):
        done["feedback"] += delete_records(db, project, [], sessions)
        db.execute(delete(Change).where(Change.project_id == project, Change.session_id.in_(sessions)))
        drop_sessions = delete(Session).where(Session.project_id == project, Session.id.in_(sessions))
        done["sessions"] += deleted_count(db.execute(drop_sessions))
        db.commit()
    never_attached = select(Feedback.id).where(
        Feedback.project_id == project, Feedback.attached_at.is_(None), Feedback.created_at < cutoff
    )
    while pending := list(db.scalars(never_attached.limit(batch))):
        db.execute(delete(Change).where(Change.project_id == project, Change.ref_id.in_(pending)))
        done["feedback"] += deleted_count(db.execute(delete(Feedback).where(Feedback.id.in_(pending))))
        db.commit()
    return done
