"""Promotion: how a new adapter version of an alias reaches traffic, and the evidence each decision used.

A policy per alias (``PromotionPolicy``; none stored means ``auto``):

- ``auto``: every published version is routed at once (the behaviour before policies).
- ``gate``: a published version is loaded into the engines but not routed. Its evals (``Eval`` rows)
  are compared with the serving version's per task family (eval name, :func:`eval_families`): every
  name both have, or exactly the policy's ``families`` once both have each. It is held when any family
  is worse than the serving version's by more than ``margin`` as judged with the standard errors,
  and promoted when none is (storage/verdicts.py's ``gate_families``).
- ``canary``: a sticky share of sessions is routed to the candidate; its live reward (and eval,
  when both versions have one) is compared with the serving version's once each arm has
  ``min_sample`` graded sessions, and it is promoted or rolled back when the evidence is clear
  (storage/verdicts.py's ``canary_verdict``; an eval of any family that is clearly worse rolls it back).

Under ``gate`` and ``canary`` an open alert on the candidate (storage/alerts.py) holds it, and
under ``canary`` rolls it back at once; under ``gate`` (the candidate serves no traffic to monitor)
a monitor alert on the serving version it was trained from holds it too. Every decision is a ``PromotionEvent`` with its
evidence. A held or rolled-back version never becomes the parent of the next training step:
:func:`training_parent` names the serving version.

The statistics are storage/verdicts.py's pure functions; the database functions here take a synchronous ORM session
(the proxy calls them through ``AsyncSession.run_sync``). Writers do not commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import verdicts
from storage.models import Alias, Eval, PromotionEvent, PromotionPolicy, utcnow

Mode = Literal["auto", "gate", "canary"]
MODES: tuple[str, ...] = ("auto", "gate", "canary")
# Defaults fixed in code, per mode (a policy's config overrides each): margin in the eval's own
# units, z the number of standard errors that makes evidence "clear", share of canary sessions,
# families the eval names a gate waits for (None: whatever names both versions have).
DEFAULTS: dict[str, dict[str, Any]] = {
    "auto": {},
    "gate": {"margin": 0.0, "z": 2.0, "eval": None, "families": None},
    "canary": {"margin": 0.05, "z": 2.0, "share": 0.1, "min_sample": 30, "eval": None},
}
CONFIG_KEYS = ("margin", "z", "share", "min_sample", "eval", "families")
MAX_FAMILIES = 50


class PolicyError(ValueError):
    """A policy setting that cannot work; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Policy:
    """An alias's promotion policy, defaults filled in, with its candidate (if one is under way)."""

    alias: str
    mode: str = "auto"
    margin: float = 0.0
    z: float = 2.0
    share: float = 0.1
    min_sample: int = 30
    # What the trainer runs after each publish (judge/evaluate.py): one eval, or one per task family.
    eval: dict[str, Any] | list[dict[str, Any]] | None = None
    candidate_version: int | None = None
    candidate_since: datetime | None = None
    families: tuple[str, ...] | None = None  # gate: the eval names every candidate is compared on

    @property
    def holds(self) -> bool:
        """Whether new versions wait for evidence (gate, canary) instead of being routed at once."""
        return self.mode in ("gate", "canary")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alias": self.alias, "mode": self.mode}
        out.update({k: getattr(self, k) for k in DEFAULTS.get(self.mode, {})})
        if out.get("families") is not None:
            out["families"] = list(out["families"])
        out["candidate_version"] = self.candidate_version
        out["candidate_since"] = self.candidate_since.isoformat() if self.candidate_since else None
        return out


def check_config(mode: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The stored config for ``mode``: given keys checked, unknown ones refused (errors name the field)."""
    if mode not in MODES:
        raise PolicyError(f"mode {mode!r}: use auto, gate or canary", "mode")
    allowed = DEFAULTS[mode]
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key not in allowed:
            raise PolicyError(f"{key} is not a setting of mode {mode}; it takes {', '.join(allowed) or 'none'}", key)
        if key in ("margin", "z", "share") and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise PolicyError(f"{key} must be a number", key)
        if key == "margin" and value < 0 or key == "z" and value <= 0:
            raise PolicyError(f"{key} must be {'at least 0' if key == 'margin' else 'positive'}", key)
        if key == "share" and not 0 < value < 1:
            raise PolicyError("share must be between 0 and 1 (exclusive)", key)
        if key == "min_sample" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise PolicyError("min_sample must be a whole number of sessions, at least 1", key)
        if key == "eval" and value is not None and not _eval_configs(value):
            raise PolicyError(
                f"eval must be an object, a list of 1 to {MAX_FAMILIES} objects with distinct names (one per task "
                "family; see docs/promotion.md), or null",
                key,
            )
        if key == "families" and value is not None and not _names(value):
            raise PolicyError(
                f"families must be a list of 1 to {MAX_FAMILIES} distinct eval names (1-200 characters) or null", key
            )
        out[key] = value
    return out


def _names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= MAX_FAMILIES
        and len(set(value)) == len(value)
        and all(isinstance(v, str) and 0 < len(v) <= 200 and "\x00" not in v for v in value)
    )


def _eval_configs(value: Any) -> bool:
    """Whether ``value`` is a policy's ``eval``: one config (an object), or a list of them, one per family
    (distinct ``name``s, the default name counting once)."""
    if isinstance(value, dict):
        return True
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_FAMILIES:
        return False
    if not all(isinstance(config, dict) for config in value):
        return False
    names = [str(config.get("name", "default")) for config in value]
    return len(set(names)) == len(names)


def get_policy(db: Session, project_id: str, alias: str) -> Policy:
    """The alias's policy (``auto`` when none is stored)."""
    row = db.get(PromotionPolicy, (project_id, alias))
    return _policy(alias, row)


def _policy(alias: str, row: PromotionPolicy | None) -> Policy:
    if row is None:
        return Policy(alias)
    values = {**DEFAULTS[row.mode], **(row.config or {})}
    return Policy(
        alias,
        row.mode,
        float(values.get("margin", 0.0)),
        float(values.get("z", 2.0)),
        float(values.get("share", 0.1)),
        int(values.get("min_sample", 30)),
        values.get("eval"),
        row.candidate_version,
        row.candidate_since,
        tuple(values["families"]) if values.get("families") is not None else None,
    )


def policies_with_candidates(db: Session) -> list[tuple[str, Policy]]:
    """(project, policy) of every alias with a candidate under way, all projects."""
    rows = db.scalars(select(PromotionPolicy).where(PromotionPolicy.candidate_version.is_not(None))).all()
    return [(r.project_id, _policy(r.alias, r)) for r in rows]


def set_policy(db: Session, project_id: str, alias: str, mode: str, config: Mapping[str, Any]) -> Policy:
    """Store the alias's policy (replacing its config); a candidate under way stays."""
    checked = check_config(mode, config)
    row = db.get(PromotionPolicy, (project_id, alias))
    if row is None:
        row = PromotionPolicy(project_id=project_id, alias=alias, mode=mode, config=checked)
        db.add(row)
    row.mode, row.config = mode, checked
    if mode == "auto":
        row.candidate_version, row.candidate_since = None, None
    db.flush()
    return _policy(alias, row)


def set_candidate(db: Session, project_id: str, alias: str, version: int | None) -> None:
    """Name the alias's candidate (None: no candidate under way)."""
    row = db.get(PromotionPolicy, (project_id, alias))
    if row is None:
        row = PromotionPolicy(project_id=project_id, alias=alias, mode="auto", config={})
        db.add(row)
    row.candidate_version = version
    row.candidate_since = utcnow() if version is not None else None
    db.flush()


def serving_version(db: Session, project_id: str, alias: str) -> int | None:
    """The version routed to all (or, under canary, most) of the alias's traffic; None: the base model."""
    row = db.scalar(select(Alias).where(Alias.project_id == project_id, Alias.name == alias))
    return row.deployed_version if row is not None else None


def training_parent(db: Session, project_id: str, alias: str) -> tuple[bool, int | None]:
    """(policy holds versions, the serving version): under gate/canary the next step starts from what serves."""
    policy = get_policy(db, project_id, alias)
    return policy.holds, serving_version(db, project_id, alias) if policy.holds else None


def record_event(
    db: Session,
    project_id: str,
    alias: str,
    *,
    version: int | None,
    serving: int | None,
    mode: str,
    decision: str,
    reason: str,
    evidence: Mapping[str, Any] | None = None,
) -> PromotionEvent:
    row = PromotionEvent(
        project_id=project_id,
        alias=alias,
        version=version,
        serving_version=serving,
        mode=mode,
        decision=decision,
        reason=reason,
        evidence=dict(evidence or {}),
    )
    db.add(row)
    db.flush()
    return row


def list_events(db: Session, project_id: str, alias: str, limit: int = 200) -> Sequence[PromotionEvent]:
    query = select(PromotionEvent).where(PromotionEvent.project_id == project_id, PromotionEvent.alias == alias)
    return list(reversed(db.scalars(query.order_by(PromotionEvent.id.desc()).limit(limit)).all()))


FINAL = ("promoted", "held", "rolled_back", "superseded", "manual")


def decision_of(db: Session, project_id: str, alias: str, version: int) -> str | None:
    """The final decision recorded for a version, if any (the newest)."""
    row = db.scalar(
        select(PromotionEvent.decision)
        .where(
            PromotionEvent.project_id == project_id,
            PromotionEvent.alias == alias,
            PromotionEvent.version == version,
            PromotionEvent.decision.in_(FINAL),
        )
        .order_by(PromotionEvent.id.desc())
        .limit(1)
    )
    return str(row) if row is not None else None


def event_to_dict(row: PromotionEvent) -> dict[str, Any]:
    return {
        "id": row.id,
        "alias": row.alias,
        "version": row.version,
        "serving_version": row.serving_version,
        "mode": row.mode,
        "decision": row.decision,
        "reason": row.reason,
        "evidence": row.evidence,
        "created_at": row.created_at.isoformat() if row.created_at else None,
    }


# --------------------------------------------------------------------------- evals


def add_eval(
    db: Session,
    project_id: str,
    alias: str,
    version: int | None,
    *,
    name: str,
    n: int,
    mean: float,
    stderr: float,
    grader: str = "",
    scores: Mapping[str, float] | None = None,
    source: str = "",
    detail: Mapping[str, Any] | None = None,
) -> Eval:
    row = Eval(
        project_id=project_id,
        alias=alias,
        version=version,
        name=name,
        grader=grader,
        n=n,
        mean=mean,
        stderr=stderr,
        scores=dict(scores or {}),
        source=source,
        detail=dict(detail or {}),
    )
    db.add(row)
    db.flush()
    return row


def list_evals(db: Session, project_id: str, alias: str, version: int | None | Literal["any"] = "any") -> list[Eval]:
    query = select(Eval).where(Eval.project_id == project_id, Eval.alias == alias)
    if version != "any":
        query = query.where(Eval.version.is_(None) if version is None else Eval.version == version)
    return list(db.scalars(query.order_by(Eval.id)).all())


def eval_families(
    db: Session,
    project_id: str,
    alias: str,
    version: int,
    serving: int | None,
    families: Sequence[str] | None = None,
) -> dict[str, verdicts.Comparison]:
    """Per task family (eval name): the candidate's newest eval of it against the serving version's newest.

    ``families`` None: every name both versions have an eval of now (one shared name: the comparison
    the gate has always made). Given (a gate policy's ``families``): exactly those names, and nothing
    (the gate waits) until both versions have an eval of each, so a harness posting its families one
    at a time is not decided on the first.
    """
    candidate = {e.name: e for e in list_evals(db, project_id, alias, version)}  # oldest first: newest wins
    current = {e.name: e for e in list_evals(db, project_id, alias, serving)}
    names = sorted(set(candidate) & set(current)) if families is None else list(families)
    if any(name not in candidate or name not in current for name in names):
        return {}
    return {
        name: verdicts.compare(verdicts.Stats.from_eval(candidate[name]), verdicts.Stats.from_eval(current[name]))
        for name in names
    }


def eval_to_dict(row: Eval) -> dict[str, Any]:
    return {
        "id": row.id,
        "alias": row.alias,
        "version": row.version,
        "name": row.name,
        "grader": row.grader,
        "n": row.n,
        "mean": row.mean,
        "stderr": row.stderr,
        "scores": row.scores,
        "source": row.source,
        "detail": row.detail,
        "created_at": row.created_at.isoformat() if row.created_at else None,
    }


def arm_rewards(db: Session, project_id: str, alias: str, since: datetime) -> dict[int | None, dict[str, float]]:
    """Per serving version: each graded, non-eval session's mean trajectory reward, for sessions since ``since``.

    A session whose calls were served by more than one version is left out (it belongs to no arm).
    """
    from storage.loaders import load_with_calls

    _, trajectories = load_with_calls(db, project_id, alias=alias, since=since)
    per: dict[int | None, dict[str, list[float]]] = {}
    mixed: set[str] = set()
    for t in trajectories:
        if t.reward is None or "eval" in t.tags or "judge" in t.tags:
            continue
        versions = set(t.adapters)
        if len(versions) != 1:
            mixed.add(t.session_id)
            continue
        per.setdefault(versions.pop(), {}).setdefault(t.session_id, []).append(t.reward)
    return {v: {s: sum(r) / len(r) for s, r in sessions.items() if s not in mixed} for v, sessions in per.items()}
