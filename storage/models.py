"""SQLAlchemy 2 typed models: the one system of record shared by proxy and trainer.

Token ids and logprobs are JSON lists: portable across Postgres and SQLite, and
read back whole (we never query inside them). Every completion is keyed by our
own id (``cmpl-…``), never the upstream's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Plain JSON, not JSONB: Postgres' JSONB refuses "\u0000", which a model can emit
# (the tiny test model does), and we never query inside these documents.
Json = JSON()
# Text a column may hold: Postgres text cannot hold NUL, so ids, names and labels with one are
# refused with a 400 (the pattern documents it in the API spec, the validators enforce it).
NO_NUL = r"^[^\x00]*$"
PENDING = text("attached_at IS NULL")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware now; every stored time is UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: Json, list[Any]: Json, datetime: DateTime(timezone=True)}


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Per-project policy, e.g. {"redact": {"store_text": false, "patterns": ["sk-[A-Za-z0-9]+"]}}.
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(16))  # "harness" | "admin"
    prefix: Mapped[str] = mapped_column(String(16))  # shown in listings, never the secret
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Alias(Base):
    """A public model name; routes to the deployed adapter version or to the base model."""

    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    base_model: Mapped[str] = mapped_column(String(200))
    deployed_version: Mapped[int | None] = mapped_column(default=None)  # None: the base model
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Session(Base):
    """One conversation or episode; sessions sharing a task form a group."""

    __tablename__ = "sessions"
    __table_args__ = (Index("ix_sessions_project_updated", "project_id", "updated_at"),)  # the dashboard's list

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    task_id: Mapped[str | None] = mapped_column(String(200), default=None, index=True)
    source: Mapped[str] = mapped_column(String(16), default="header")  # header|metadata|path|linked|new
    tags: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Completion(Base):
    """One call through the proxy, recorded token-exactly."""

    __tablename__ = "completions"
    __table_args__ = (
        Index("ix_completions_project_session", "project_id", "session_id", "created_at"),
        Index("ix_completions_project_created", "project_id", "created_at"),
        Index("ix_completions_link_key", "project_id", "link_key"),
        Index("ix_completions_client_request", "project_id", "client_request_id"),
        # The dashboard's lists and counts (migration 0009).
        Index("ix_completions_project_alias_created", "project_id", "alias", "created_at"),
        Index("ix_completions_project_termination", "project_id", "termination", "created_at"),
        Index("ix_completions_end_user", "project_id", "end_user"),  # deletion by end user (migration 0014)
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    session_id: Mapped[str] = mapped_column(String(200))
    task_id: Mapped[str | None] = mapped_column(String(200), default=None)
    client_request_id: Mapped[str | None] = mapped_column(String(200), default=None)
    upstream_id: Mapped[str | None] = mapped_column(String(200), default=None)  # informational only
    endpoint: Mapped[str] = mapped_column(String(32))  # "chat" | "completions": the engine route called
    # The API the client spoke: "chat" and "completions" natively, or a dialect ("responses", ...)
    # translated at the edge. For a dialect, request/response/choices are the engine-facing chat call
    # (what linking, trajectories and exports read) and client_request/client_response what the
    # harness sent and received; for the native APIs those two are NULL (request/response are the client's).
    dialect: Mapped[str] = mapped_column(String(16), default="chat", server_default="chat")
    client_request: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    client_response: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    alias: Mapped[str] = mapped_column(String(200))
    served_model: Mapped[str] = mapped_column(String(200))  # e.g. "support@v3" or the base name
    adapter_version: Mapped[int | None] = mapped_column(default=None)
    adapter_sha256: Mapped[str | None] = mapped_column(String(64), default=None)  # the served version's content
    tags: Mapped[list[Any]] = mapped_column(default=list)
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)
    response: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    prompt_token_ids: Mapped[list[Any] | None] = mapped_column(default=None)
    # Per choice: {"index", "token_ids", "logprobs", "finish_reason", "message"|"text"}.
    choices: Mapped[list[Any]] = mapped_column(default=list)
    sampling: Mapped[dict[str, Any]] = mapped_column(default=dict)
    usage: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    status_code: Mapped[int] = mapped_column(default=200)
    termination: Mapped[str] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text, default=None)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    # sha256 of (request messages + first returned assistant message): the next turn's prefix.
    link_key: Mapped[str | None] = mapped_column(String(64), default=None)
    parent_id: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    latency_ms: Mapped[float | None] = mapped_column(Float, default=None)
    ttft_ms: Mapped[float | None] = mapped_column(Float, default=None)
    # The caller the client named (``user``, ``metadata.user_id`` or ``metadata.end_user``): what
    # ``DELETE /v1/admin/end-users/{id}`` finds a person's sessions by.
    end_user: Mapped[str | None] = mapped_column(String(200), default=None)


class Feedback(Base):
    """A fact about a completion or a session, from a source, at a time; history is kept."""

    __tablename__ = "feedback"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key"),
        Index("ix_feedback_target", "project_id", "target_kind", "target_id"),
        Index("ix_feedback_session", "project_id", "session_id"),
        Index("ix_feedback_completion", "project_id", "completion_id"),
        Index("ix_feedback_project_created", "project_id", "created_at"),  # the dashboard's reward curve
        # Pending feedback (target not landed yet): the recorder asks per batch whether any exists.
        Index("ix_feedback_pending", "project_id", postgresql_where=PENDING, sqlite_where=PENDING),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    idempotency_key: Mapped[str] = mapped_column(String(200))
    target_kind: Mapped[str] = mapped_column(String(32))  # completion_id|session_id|client_request_id
    target_id: Mapped[str] = mapped_column(String(200))
    completion_id: Mapped[str | None] = mapped_column(String(64), default=None)  # resolved
    session_id: Mapped[str | None] = mapped_column(String(200), default=None)  # resolved
    choice: Mapped[int | None] = mapped_column(Integer, default=None)  # one choice of an n > 1 call; None: all
    name: Mapped[str] = mapped_column(String(200))
    value: Mapped[Any] = mapped_column(Json, default=None)
    comment: Mapped[str | None] = mapped_column(Text, default=None)
    source: Mapped[str] = mapped_column(String(200), default="")
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    attached_at: Mapped[datetime | None] = mapped_column(default=None)  # None: pending


class Adapter(Base):
    """One published LoRA adapter version of an alias."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("project_id", "alias", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int]
    parent_version: Mapped[int | None] = mapped_column(default=None)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    base_model: Mapped[str] = mapped_column(String(200))
    base_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    training_run_id: Mapped[int | None] = mapped_column(ForeignKey("training_runs.id"), default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Deployment(Base):
    """History of routing switches for an alias; the alias row holds the current one."""

    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int | None] = mapped_column(default=None)  # None: back to the base model
    previous_version: Mapped[int | None] = mapped_column(default=None)
    status: Mapped[str] = mapped_column(String(32))  # "active" | "failed" | "superseded"
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrainingRun(Base):
    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    objective: Mapped[str] = mapped_column(String(16))
    base_model: Mapped[str] = mapped_column(String(200))
    base_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class TrainingStep(Base):
    __tablename__ = "training_steps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("training_runs.id"), index=True)
    step: Mapped[int]
    adapter_version: Mapped[int | None] = mapped_column(default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsedTrajectory(Base):
    """Which trajectories a training step consumed, so none is trained on twice."""

    __tablename__ = "used_trajectories"
    __table_args__ = (UniqueConstraint("project_id", "alias", "trajectory_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    trajectory_id: Mapped[str] = mapped_column(String(300))
    step_id: Mapped[int] = mapped_column(ForeignKey("training_steps.id"))


class JudgeCalibration(Base):
    """How one judge configuration agreed with a project's existing grades; the newest per fingerprint counts."""

    __tablename__ = "judge_calibrations"
    __table_args__ = (Index("ix_judge_calibrations_lookup", "project_id", "fingerprint", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    fingerprint: Mapped[str] = mapped_column(String(64))  # JudgeSettings.fingerprint(): what changes a score
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the settings it was measured under
    n: Mapped[int]  # labelled pairs with a readable judge score
    unreadable: Mapped[int] = mapped_column(default=0)
    spearman: Mapped[float] = mapped_column(Float)
    accuracy: Mapped[float] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    baseline: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the keyword scorer on the same set
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsedFeedback(Base):
    """Which (trajectory, text feedback item, objective) a step trained on: SDPO and corrections, once each.

    Kept apart from ``used_trajectories`` (scalar rewards, once per trajectory): a comment that
    arrives after a session was trained on numerically still yields its self-distillation example.
    """

    __tablename__ = "used_feedback"
    # Not unique (migration 0015): the feed never takes a key twice (it screens on these columns), but a
    # retraining from a dataset (``train --dataset``, e.g. after a deletion) trains the same items again on
    # purpose, and its version's lineage must record them.
    __table_args__ = (Index("ix_used_feedback_lookup", "project_id", "alias", "trajectory_id", "feedback_id",
                            "objective"),)  # fmt: skip

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    trajectory_id: Mapped[str] = mapped_column(String(300))
    feedback_id: Mapped[str] = mapped_column(String(200))  # a feedback row's id, or "implicit:<completion id>"
    objective: Mapped[str] = mapped_column(String(16))  # "reward" (scalar) | "sdpo" | "correction"
    step_id: Mapped[int] = mapped_column(ForeignKey("training_steps.id"))


class Alert(Base):
    """Something about an alias's version that should stop it spreading: a monitor's window, or attestation.

    One open row per (project, alias, version, kind, name): a monitor that sees the same breach again
    updates ``value``/``last_seen_at`` rather than adding rows. Open until an admin resolves it (a human
    decides that a moved window was fine); promotion reads ``storage.alerts.open_alerts``.
    """

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_open", "project_id", "alias", "version", "resolved_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int | None] = mapped_column(default=None)  # the version it is about; None: the base model
    kind: Mapped[str] = mapped_column(String(32))  # "monitor" | "attestation" | ...
    name: Mapped[str] = mapped_column(String(64))  # the monitor ("completion_tokens", ...) or check's name
    baseline_version: Mapped[int | None] = mapped_column(default=None)  # what it was compared with
    value: Mapped[float | None] = mapped_column(Float, default=None)
    baseline: Mapped[float | None] = mapped_column(Float, default=None)
    threshold: Mapped[float | None] = mapped_column(Float, default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(default=None)  # None: open
    resolved_by: Mapped[str | None] = mapped_column(String(200), default=None)


# SQLite makes only an INTEGER PRIMARY KEY the rowid (AUTOINCREMENT: never reused).
_SEQ = BigInteger().with_variant(Integer(), "sqlite")


class Change(Base):
    """One entry of the change log: a call recorded or a feedback item stored (a revision is a new item).

    Written by database triggers (migration 0008), so every insert path logs, COPY included.
    Readers page by ``(xid, seq)`` and never past a transaction still in flight (storage/changes.py).
    """

    __tablename__ = "changes"
    __table_args__ = (
        Index("ix_changes_position", "project_id", "xid", "seq"),
        Index("ix_changes_ref", "project_id", "ref_id"),  # deletion and retention (migration 0014)
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(_SEQ, primary_key=True, autoincrement=True)
    # The writing transaction's id (Postgres pg_current_xact_id(); 0 on SQLite, whose writers are serial).
    xid: Mapped[int] = mapped_column(BigInteger)
    project_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # "call" | "feedback"
    ref_id: Mapped[str] = mapped_column(String(200))  # the completion's or the feedback item's id
    session_id: Mapped[str | None] = mapped_column(String(200), default=None)  # None: feedback still pending


class ChangeCursor(Base):
    """How far one reader of the change log (the trainer of an alias, failure mining, ...) has settled."""

    __tablename__ = "change_cursors"

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    consumer: Mapped[str] = mapped_column(String(200), primary_key=True)  # e.g. "train:support", "mine"
    xid: Mapped[int] = mapped_column(BigInteger, default=0)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class CompletionFlag(Base):
    """A failure mode ``onthejob mine`` found in one completion (storage/mining.py); one row per mode."""

    __tablename__ = "completion_flags"
    __table_args__ = (
        UniqueConstraint("project_id", "completion_id", "mode"),
        Index("ix_completion_flags_mode", "project_id", "mode"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(String(64))
    completion_id: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(200))
    alias: Mapped[str] = mapped_column(String(200))
    adapter_version: Mapped[int | None] = mapped_column(default=None)
    mode: Mapped[str] = mapped_column(String(32))  # storage.mining.MODES
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)  # what matched (a line, a pattern, a value)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Tombstone(Base):
    """A deleted session: the recorder never lands its calls, even copies still in a spool (storage/deletion.py)."""

    __tablename__ = "tombstones"

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EndUserTombstone(Base):
    """A deleted end user: their calls made before ``created_at`` never land, even spooled (storage/deletion.py)."""

    __tablename__ = "end_user_tombstones"

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    end_user: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Eval(Base):
    """One evaluation result of an alias version (``version`` None: the base model), with its standard error.

    Posted by ``onthejob eval``, by the trainer after a publish, or by a harness that evaluates in its
    own loop. ``scores`` (optional) maps item ids to per-item scores, so two versions evaluated on
    the same items are compared paired (storage/promotion.py).
    """

    __tablename__ = "evals"
    __table_args__ = (Index("ix_evals_lookup", "project_id", "alias", "name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int | None] = mapped_column(default=None)  # None: the base model
    name: Mapped[str] = mapped_column(String(200))  # the eval set, e.g. "heldout"
    grader: Mapped[str] = mapped_column(String(200), default="")
    n: Mapped[int]
    mean: Mapped[float] = mapped_column(Float)
    stderr: Mapped[float] = mapped_column(Float)
    scores: Mapped[dict[str, Any]] = mapped_column(default=dict)  # item id -> score (may be empty)
    source: Mapped[str] = mapped_column(String(200), default="")
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PromotionPolicy(Base):
    """How new versions of an alias reach traffic (auto | gate | canary), and the candidate under way."""

    __tablename__ = "promotion_policies"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(200), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16), default="auto")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # margin, z, share, min_sample, eval
    candidate_version: Mapped[int | None] = mapped_column(default=None)  # loaded, not (fully) routed
    candidate_since: Mapped[datetime | None] = mapped_column(default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class PromotionEvent(Base):
    """Every promotion decision (and manual deployment) with the evidence it was taken on."""

    __tablename__ = "promotion_events"
    __table_args__ = (Index("ix_promotion_events_alias", "project_id", "alias", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    alias: Mapped[str] = mapped_column(String(200))
    version: Mapped[int | None] = mapped_column(default=None)  # the candidate (None: the base model)
    serving_version: Mapped[int | None] = mapped_column(default=None)  # what served the alias when decided
    mode: Mapped[str] = mapped_column(String(16))
    decision: Mapped[str] = mapped_column(String(32))  # candidate|canary|promoted|held|rolled_back|superseded|manual
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Attestation(Base):
    """What an adapter version must serve: its content hash and the greedy logprobs of a fixed probe."""

    __tablename__ = "attestations"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    alias: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {"tokens": [...], "logprobs": [...]}
    replica: Mapped[str] = mapped_column(Text, default="")  # where it was first measured
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    """A named, immutable selection of trajectories (storage/datasets.py); ``train`` and ``export`` take one."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    # How it was selected: {"kind": "filter" | "mine" | "curated", "filter": {...}, ...}.
    filter: Mapped[dict[str, Any]] = mapped_column(default=dict)
    counts: Mapped[dict[str, Any]] = mapped_column(default=dict)  # at creation (show recounts what is left)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DatasetItem(Base):
    """One trajectory of a dataset, pinned at creation: its calls (one path) and the feedback and reward it had."""

    __tablename__ = "dataset_items"
    __table_args__ = (
        UniqueConstraint("dataset_id", "trajectory_id"),
        Index("ix_dataset_items_session", "project_id", "session_id"),  # a deleted session's items
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    project_id: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str] = mapped_column(String(200))
    task_id: Mapped[str | None] = mapped_column(String(200), default=None)
    trajectory_id: Mapped[str] = mapped_column(String(300))
    role: Mapped[str] = mapped_column(String(16), default="item")  # "item" | curated: "failure" | "success"
    completion_ids: Mapped[list[Any]] = mapped_column(default=list)  # the path, root first
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of token ids and mask: rebuilt the same, or not used
    reward: Mapped[float | None] = mapped_column(Float, default=None)
    reward_detail: Mapped[dict[str, Any]] = mapped_column(default=dict)  # which item the reward came from
    feedback: Mapped[list[Any]] = mapped_column(default=list)  # [{"id", "name", "value", "source", "scalar"}]
