"""The record: projects and their keys, aliases, sessions, completions, feedback."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import PENDING, Base, Json, utcnow


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


def _install_stored_form() -> None:
    """Rows stored as their parent plus what is new load in full (storage/stored_form.py)."""
    from sqlalchemy import event

    from storage.stored_read import on_load

    event.listen(Completion, "load", on_load)
    event.listen(Completion, "refresh", on_load)


_install_stored_form()
