"""Grading, the one place for it (pure functions): which call or session a feedback
item names, which revision wins, what scalar a trajectory gets, and why a trajectory
is left out of training.

* Targets (:class:`Targets`): a ``completion_id`` names that call, a
  ``client_request_id`` the newest call the client gave that id, a ``session_id``
  a session; always within one project, among calls the caller already holds (the
  database query, the recorder's batch and the loaders all ask this).
* Winners (:func:`newest`): per target, the newest item from each ``(source, name)``.
* Exclusions (:class:`Exclusion`): every reason a trajectory or example is left out,
  shared by storage, the export and the trainer; one rule for "no sampled tokens"
  (:func:`has_sampled_tokens`).

Default reward rule (docs/architecture.md, "The reward rule"):

* ``reward`` (a number) as is; ``thumbs`` (a bool) → +1 / −1; ``outcome`` labels
  ``success`` 1, ``failure`` 0, ``timeout`` and ``abort`` 0 (a policy-caused
  failure is a failure, never dropped), ``infra_error`` masked.
* Revisions: per target, the newest item from the same ``(source, name)`` wins.
* Session-level feedback applies to all of the session's trajectories; without
  it, the grade of the trajectory's last graded completion applies. Several
  grades in the winning scope: the highest-priority name, then the newest.
* The proxy's own view counts too: a trajectory with a call ended by
  ``upstream_error`` is masked; one ended by ``timeout`` or
  ``client_disconnected`` is a failure unless its last call carries a grade of
  its own (the harness knew better), so failures cannot vanish by going silent.
* Comments alone give no scalar. A judge's grades (feedback of source ``judge``) never
  outrank a harness or human grade on the same trajectory, however recent, never make a
  proxy-seen failure vanish, and count only while the project's judge is calibrated
  (``judge_accepted``); otherwise the trajectory is excluded as ``judge_uncalibrated``.
* No grade ⇒ ``reward`` None with ``reward_detail["excluded"] = "ungraded"``;
  masked ⇒ None with ``"infra_error"``. Never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from storage.trajectories import UNUSABLE_FLAGS, Trajectory, column

JUDGE_SOURCE = "judge"  # the feedback source of every judge grade
JUDGE_TAG = "judge"  # the tag of the judge's own model calls: never trained on


class Exclusion(StrEnum):
    """Why a trajectory (or a text-feedback example) is not trained on or exported; each is counted."""

    EVAL = "eval"  # held-out traffic, never trained on
    ALREADY_USED = "already_used"
    OTHER_ALIAS = "other_alias"
    MISSING_TOKEN_IDS = "missing_token_ids"  # capture (storage.trajectories flags)
    PREFIX_MISMATCH = "prefix_mismatch"
    UNALIGNED = "unaligned"
    NO_SAMPLED_TOKENS = "no_sampled_tokens"
    INFRA_ERROR = "infra_error"  # masked by the reward rule
    UNGRADED = "ungraded"
    JUDGE_UNCALIBRATED = "judge_uncalibrated"  # a judge grade below the agreement gate
    JUDGE_CALL = "judge_call"  # the judge's own model calls (tagged "judge")
    TOO_LONG = "too_long"  # the trainer's screen
    MISALIGNED = "misaligned"
    REDACTED = "redacted"  # token ids masked by the proxy's redaction
    UNSUPPORTED_SAMPLING = "unsupported_sampling"
    BELOW_MIN_REWARD = "below_min_reward"  # the export's
    NOT_CHAT = "not_chat"
    NO_GROUP = "no_group"


def has_sampled_tokens(mask: Sequence[int | bool]) -> bool:
    """Whether a trajectory has a token to train on: a sampled one after the first (nothing predicts that)."""
    return any(mask[1:])


def training_exclusion(traj: Trajectory, used: Collection[str]) -> Exclusion | None:
    """Why a stored trajectory may not be trained on, or None. First reason wins."""
    if "eval" in traj.tags:
        return Exclusion.EVAL
    if JUDGE_TAG in traj.tags:
        return Exclusion.JUDGE_CALL
    if traj.id in used:
        return Exclusion.ALREADY_USED
    flag = next((f for f in UNUSABLE_FLAGS if f in traj.flags), None)
    if flag:
        return Exclusion(flag)
    if not has_sampled_tokens(traj.mask):
        return Exclusion.NO_SAMPLED_TOKENS
    if traj.reward is None:
        return Exclusion(traj.reward_detail.get("excluded", Exclusion.UNGRADED))
    return None


# --------------------------------------------------------------------------- targets


class CallRef(Protocol):
    """What resolving a feedback target needs of a call (an ORM row, a recorded batch's record)."""

    @property
    def id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def client_request_id(self) -> str | None: ...
    @property
    def created_at(self) -> Any: ...  # datetime, or ISO text: one kind per index


class LandedCall(CallRef, Protocol):
    """A call with its project (the recorder's batches mix projects)."""

    @property
    def project_id(self) -> str: ...


class Targets:
    """Which of these calls (or sessions) a feedback target names; all of them of one project."""

    def __init__(self, calls: Iterable[CallRef], sessions: Iterable[str] = ()) -> None:
        self.by_id: dict[str, CallRef] = {}
        self.by_request: dict[str, CallRef] = {}
        self.sessions = set(sessions)
        for call in sorted(calls, key=lambda c: (c.created_at, c.id)):  # a client request id: the newest wins
            self.by_id[call.id] = call
            self.sessions.add(call.session_id)
            if call.client_request_id:
                self.by_request[call.client_request_id] = call

    def resolve(self, kind: str, target_id: str) -> tuple[str | None, str | None]:
        """(completion_id, session_id) of a target; (None, None) when it names none of these."""
        if kind == "session_id":
            return (None, target_id) if target_id in self.sessions else (None, None)
        call = (self.by_id if kind == "completion_id" else self.by_request).get(target_id)
        return (call.id, call.session_id) if call is not None else (None, None)


# --------------------------------------------------------------------------- winners

T = TypeVar("T")


def newest(items: Iterable[T], key: Callable[[T], Hashable]) -> list[T]:
    """The winners: per ``key`` (a target, a source and a name), the newest item by (created_at, id), oldest first."""
    best: dict[Hashable, T] = {}
    for item in items:
        k = key(item)
        if k not in best or _order(item) > _order(best[k]):
            best[k] = item
    return sorted(best.values(), key=_order)


def _order(item: Any) -> tuple[Any, str]:
    return item.created_at, item.id


# --------------------------------------------------------------------------- the reward rule


class _Masked:
    """A grade that removes the trajectory from training (infrastructure failure)."""

    def __repr__(self) -> str:
        return "MASKED"


MASKED = _Masked()
Scalar = float | _Masked | None
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class RewardRule:
    """How feedback names and values become scalars; ``from_config`` reads a project's settings."""

    name: str = "default"
    numeric: tuple[str, ...] = ("reward",)
    booleans: Mapping[str, tuple[float, float]] = field(default_factory=lambda: {"thumbs": (1.0, -1.0)})
    # Label → scalar; None masks the trajectory.
    labels: Mapping[str, Mapping[str, float | None]] = field(
        default_factory=lambda: {
            "outcome": {"success": 1.0, "failure": 0.0, "timeout": 0.0, "abort": 0.0, "infra_error": None}
        }
    )
    priority: tuple[str, ...] = ("reward", "outcome", "thumbs")
    failure: float = 0.0  # what a proxy-seen timeout or disconnect is worth
    proxy_failures: tuple[str, ...] = ("timeout", "client_disconnected")
    proxy_masked: tuple[str, ...] = ("upstream_error",)
    judge_source: str = JUDGE_SOURCE  # feedback from this source is the judge's: ranked below every other
    judge_accepted: bool = False  # the project's judge passes its agreement gate (storage.judge_store)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> RewardRule:
        """A rule from e.g. ``{"numeric": ["score"], "labels": {"outcome": {"partial": 0.5}}}``.

        Given keys replace the defaults, except ``labels`` and ``booleans``, which
        are merged name by name (a label map given for a name replaces its entries
        one by one).
        """
        if not config:
            return cls()
        base = cls()
        labels = {k: dict(v) for k, v in base.labels.items()}
        for name, mapping in (config.get("labels") or {}).items():
            labels.setdefault(name, {}).update({str(k).lower(): v for k, v in mapping.items()})
        booleans = dict(base.booleans)
        booleans.update({k: (float(v[0]), float(v[1])) for k, v in (config.get("booleans") or {}).items()})
        return cls(
            name=str(config.get("name", "custom")),
            numeric=tuple(config.get("numeric", base.numeric)),
            booleans=booleans,
            labels=labels,
            priority=tuple(config.get("priority", base.priority)),
            failure=float(config.get("failure", base.failure)),
            proxy_failures=tuple(config.get("proxy_failures", base.proxy_failures)),
            proxy_masked=tuple(config.get("proxy_masked", base.proxy_masked)),
        )

    def score(self, name: str, value: Any, comment: str | None = None) -> Scalar:
        """The scalar one feedback item gives, MASKED, or None (no scalar)."""
        if name in self.numeric and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) if math.isfinite(value) else None
        if name in self.booleans and isinstance(value, bool):
            yes, no = self.booleans[name]
            return yes if value else no
        if name in self.labels and isinstance(value, str):
            table = self.labels[name]
            label = value.strip().lower()
            if label in table:
                scalar = table[label]
                return MASKED if scalar is None else float(scalar)
        return None

    def rank(self, name: str) -> int:
        return self.priority.index(name) if name in self.priority else len(self.priority)


DEFAULT_RULE = RewardRule()


@dataclass(frozen=True)
class Grade:
    """One feedback item as the rule sees it, its target resolved."""

    id: str
    completion_id: str | None  # None: about the whole session
    session_id: str | None
    name: str
    value: Any
    comment: str | None
    source: str
    created_at: datetime
    choice: int | None = None  # one choice of an n > 1 call; None: the whole call (or session)

    @property
    def scope(self) -> tuple[str, str | None, int | None]:
        if self.completion_id is None:
            return ("session", self.session_id, None)
        return ("completion" if self.choice is None else "choice", self.completion_id, self.choice)

    def describe(self) -> dict[str, Any]:
        return {
            "feedback_id": self.id,
            "name": self.name,
            "value": self.value,
            "source": self.source,
            "scope": self.scope[0],
            "completion_id": self.completion_id,
            **({"choice": self.choice} if self.choice is not None else {}),
        }


def to_grade(row: Any) -> Grade:
    """From a ``feedback`` row or dict whose ``completion_id``/``session_id`` are resolved."""
    created = column(row, "created_at") or EPOCH
    if created.tzinfo is None:  # SQLite hands back naive UTC times
        created = created.replace(tzinfo=UTC)
    return Grade(
        id=str(column(row, "id", "")),
        completion_id=column(row, "completion_id"),
        session_id=column(row, "session_id"),
        name=str(column(row, "name", "")),
        value=column(row, "value"),
        comment=column(row, "comment"),
        source=str(column(row, "source", "") or ""),
        created_at=created,
        choice=column(row, "choice"),
    )


def current(grades: Iterable[Grade]) -> list[Grade]:
    """The winning grades: per target, the newest item from each (source, name)."""
    return newest(grades, lambda g: (*g.scope, g.source, g.name))


def resolve_grades(feedback: Iterable[Any], completions: Sequence[CallRef]) -> list[Grade]:
    """Grades of ``feedback`` rows with targets resolved; pending items resolve against ``completions``."""
    targets = Targets(completions)
    out: list[Grade] = []
    for fb in feedback:
        grade = to_grade(fb)
        if fb.attached_at is None:
            completion_id, session_id = targets.resolve(fb.target_kind, fb.target_id)
            if session_id is None:
                continue
            grade = replace(grade, completion_id=completion_id, session_id=session_id)
        out.append(grade)
    return out


def _pick(scored: list[tuple[Grade, float]], rule: RewardRule) -> tuple[Grade, float]:
    return min(scored, key=lambda gs: (rule.rank(gs[0].name), -gs[0].created_at.timestamp(), gs[0].id))


def grades_about(traj: Trajectory, feedback: Iterable[Any]) -> list[Grade]:
    """The grades that speak about ``traj``: of its session, or of one of its calls (of the choice it continues)."""
    calls = set(traj.completion_ids)
    taken = {(t.completion_id, t.choice_index) for t in traj.turns}  # the choice of each call it continues
    grades = [g if isinstance(g, Grade) else to_grade(g) for g in feedback]
    return [
        g
        for g in grades
        if (g.completion_id in calls and (g.choice is None or (g.completion_id, g.choice) in taken))
        or (g.completion_id is None and g.session_id == traj.session_id)
    ]


def resolve_reward(
    traj: Trajectory, feedback: Iterable[Any], rule: RewardRule = DEFAULT_RULE
) -> tuple[float | None, dict[str, Any]]:
    """The reward of one trajectory and how it was derived (``reward_detail``)."""
    detail: dict[str, Any] = {"rule": rule.name}
    mine = grades_about(traj, feedback)
    scored: list[tuple[Grade, Scalar]] = [(g, rule.score(g.name, g.value, g.comment)) for g in current(mine)]
    scored = [(g, s) for g, s in scored if s is not None]
    detail["candidates"] = [{**g.describe(), "scalar": None if s is MASKED else s} for g, s in scored]

    masked_by = next((t for t in rule.proxy_masked if t in traj.flags), None)
    if masked_by:
        return None, {**detail, "excluded": Exclusion.INFRA_ERROR, "scope": "proxy", "termination": masked_by}
    masked = [g for g, s in scored if s is MASKED]
    if masked:
        return None, {**detail, "excluded": Exclusion.INFRA_ERROR, "by": masked[0].describe()}
    # A judge grade never outranks a harness or human grade, however recent: it is only heard
    # when nobody else gave the trajectory a scalar, and only while the judge is calibrated.
    judged = [(g, s) for g, s in scored if isinstance(s, float) and g.source == rule.judge_source]
    values = [(g, s) for g, s in scored if isinstance(s, float) and g.source != rule.judge_source]

    leaf = traj.completion_ids[-1] if traj.completion_ids else None
    failed_by = next((t for t in rule.proxy_failures if t in traj.flags), None)
    if failed_by and not any(g.completion_id == leaf for g, _ in values):
        return rule.failure, {**detail, "scope": "proxy", "termination": failed_by, "reward": rule.failure}

    session_level = [(g, s) for g, s in values if g.completion_id is None]
    if session_level:
        g, s = _pick(session_level, rule)
        return s, {**detail, **g.describe(), "reward": s}
    for cid in reversed(traj.completion_ids):
        own = [(g, s) for g, s in values if g.completion_id == cid]
        own = [(g, s) for g, s in own if g.choice is not None] or own  # a grade of this very choice first
        if own:
            g, s = _pick(own, rule)
            return s, {**detail, **g.describe(), "reward": s}
    if judged:
        g, s = _pick(judged, rule)
        if not rule.judge_accepted:
            return None, {**detail, "excluded": Exclusion.JUDGE_UNCALIBRATED, "by": g.describe()}
        return s, {**detail, **g.describe(), "reward": s}
    return None, {**detail, "excluded": Exclusion.UNGRADED}


def apply_rewards(trajectories: Iterable[Trajectory], feedback: Iterable[Any], rule: RewardRule = DEFAULT_RULE) -> None:
    """Fill ``reward`` and ``reward_detail`` of each trajectory in place."""
    grades = [g if isinstance(g, Grade) else to_grade(g) for g in feedback]
    for traj in trajectories:
        traj.reward, traj.reward_detail = resolve_reward(traj, grades, rule)


def is_graded(grades: Iterable[Grade], rule: RewardRule = DEFAULT_RULE) -> bool:
    """Whether any current item gives a scalar (or masks): a session with none is "ungraded".

    The judge's grades do not count: the ungraded share watches what harnesses and people grade.
    """
    return any(
        rule.score(g.name, g.value, g.comment) is not None for g in current(grades) if g.source != rule.judge_source
    )
