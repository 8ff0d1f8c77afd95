"""What has been trained already, per (trajectory, feedback item, objective), and the part still to train.

A trajectory's id is its leaf: the last call and choice of its branch
(:func:`storage.trajectories.trajectory_id`). When a session goes on after being
trained on, the longer branch gets a new id, and the id of every shorter branch it
extends is the id of one of its own turns. So "which prefix was trained already" is a
lookup: the newest of its turns whose id is recorded as used with the same feedback
item and objective. That prefix is masked (its tokens stay as context, mask 0); what
follows is trained. Nothing is trained twice for the same feedback, and a revised
grade or a late comment (a new feedback item) still trains what it grades.

Scalar training (tis, ppo, bc alike) records objective ``reward`` with the feedback
item the reward came from (``proxy:<termination>`` for the proxy's own view of a
timeout or disconnect). Feedback id ``*`` (rows carried over from the old
``used_trajectories``) means used whatever the feedback.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage.grading import Exclusion, has_sampled_tokens, training_exclusion
from storage.models import UsedFeedback
from storage.trajectories import Trajectory, trajectory_id

REWARD = "reward"  # the objective recorded for scalar training
ANY_FEEDBACK = "*"
Key = tuple[str, str, str]  # (trajectory id, feedback id, objective)


def reward_feedback(traj: Trajectory) -> str | None:
    """The feedback item a graded trajectory's reward came from; None when it has no reward.

    ``*`` for a reward that names no item (a trajectory built by hand, not by the reward rule).
    """
    if traj.reward is None:
        return None
    detail = traj.reward_detail
    if detail.get("scope") == "proxy":
        return f"proxy:{detail.get('termination')}"
    fid = detail.get("feedback_id")
    return str(fid) if fid is not None else ANY_FEEDBACK  # a reward of unknown origin: used whatever the feedback


def prefix_ids(traj: Trajectory) -> list[str]:
    """Ids of the branches this trajectory extends, oldest first, ending with its own id."""
    ids = [trajectory_id(t.completion_id, t.choice_index) for t in traj.turns]
    if not ids or ids[-1] != traj.id:
        ids.append(traj.id)  # a leaf call that returned nothing has no turn
    return ids


def reward_key(traj: Trajectory) -> Key | None:
    """The key a step records when it trains ``traj`` on its scalar reward."""
    fid = reward_feedback(traj)
    return (traj.id, fid, REWARD) if fid is not None else None


def untrained(traj: Trajectory, used: Collection[Key], objective: str = REWARD) -> Trajectory | None:
    """``traj`` with the prefix already trained on its feedback masked; None when nothing is left to train."""
    fid = reward_feedback(traj)
    ids = prefix_ids(traj)
    done = [i for i, tid in enumerate(ids) if (tid, fid, objective) in used or (tid, ANY_FEEDBACK, objective) in used]
    if not done:
        return traj
    last = max(done)
    if last >= len(traj.turns) or ids[last] == traj.id:
        return None
    cut = traj.turns[last].end
    mask = [0] * cut + traj.mask[cut:]
    if not has_sampled_tokens(mask):
        return None
    return dataclasses.replace(traj, mask=mask, reward_detail={**traj.reward_detail, "trained_prefix": ids[last]})


def used_keys(
    db: DbSession, project: str, alias: str, trajectory_ids: Iterable[str] | None = None, objective: str = REWARD
) -> set[Key]:
    """Recorded keys of ``alias`` for ``objective``; only those of ``trajectory_ids`` when given."""
    stmt = select(UsedFeedback.trajectory_id, UsedFeedback.feedback_id, UsedFeedback.objective).where(
        UsedFeedback.project_id == project, UsedFeedback.alias == alias, UsedFeedback.objective == objective
    )
    if trajectory_ids is None:
        return {(t, f, o) for t, f, o in db.execute(stmt)}
    ids = list(dict.fromkeys(trajectory_ids))
    out: set[Key] = set()
    for start in range(0, len(ids), 5000):
        chunk = stmt.where(UsedFeedback.trajectory_id.in_(ids[start : start + 5000]))
        out |= {(t, f, o) for t, f, o in db.execute(chunk)}
    return out


def screen_batch(
    trajectories: Sequence[Trajectory], alias: str, used: Collection[Key]
) -> tuple[list[Trajectory], Counter[str]]:
    """The trainable part of each trajectory of ``alias``, and every exclusion by reason.

    ``already_used``: trained on this very feedback already (its prefix, if any, is masked instead).
    """
    batch: list[Trajectory] = []
    excluded: Counter[str] = Counter()
    for traj in trajectories:
        if traj.alias != alias:
            excluded[Exclusion.OTHER_ALIAS] += 1
            continue
        reason = training_exclusion(traj, ())
        part = untrained(traj, used) if reason is None else None
        if reason is None and part is None:
            reason = Exclusion.ALREADY_USED
        if part is not None:
            batch.append(part)
        else:
            excluded[reason or Exclusion.ALREADY_USED] += 1
    return batch, excluded


def mark_used(db: DbSession, project: str, alias: str, keys: Iterable[Key], step_id: int) -> int:
    """Record the keys a step trained on (the caller commits with the step); returns how many."""
    rows = [
        UsedFeedback(project_id=project, alias=alias, trajectory_id=t, feedback_id=f, objective=o, step_id=step_id)
        for t, f, o in dict.fromkeys(keys)
    ]
    db.add_all(rows)
    return len(rows)
