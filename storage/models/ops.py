"""Operations: alerts, the change log and its cursors, flags on completions, deletion tombstones."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, utcnow


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
    """One entry of the change log: a call recorded or a feedback item stored (a revision is a new item),
    or a delete (kind "deletion": a session, or with ``session_id`` NULL an end user named by ``ref_id``).

    Calls and feedback are written by database triggers (migration 0008), so every insert path logs, COPY
    included; deletions by :func:`storage.changes.log_deletion`, in the delete's transaction.
    Readers page by ``(xid, seq)`` and never past a transaction still in flight (storage/changes.py).
    """

    __tablename__ = "changes"
    __table_args__ = (
        Index("ix_changes_position", "project_id", "xid", "seq"),
        Index("ix_changes_ref", "project_id", "ref_id"),  # deletion and retention (migration 0014)
        # The deletion entries alone, in log order: every worker follows them (migration 0018).
        Index(
            "ix_changes_deletions",
            "xid",
            "seq",
            postgresql_where=text("kind = 'deletion'"),
            sqlite_where=text("kind = 'deletion'"),
        ),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(_SEQ, primary_key=True, autoincrement=True)
    # The writing transaction's id (Postgres pg_current_xact_id(); 0 on SQLite, whose writers are serial).
    xid: Mapped[int] = mapped_column(BigInteger)
    project_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # "call" | "feedback" | "deletion"
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
    """A deleted session: the recorder never lands its calls made before ``created_at``, the time of the (latest)
    delete by the database's clock, even copies still in a spool; later calls of that id start it afresh
    (storage/deletion.py)."""

    __tablename__ = "tombstones"

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EndUserTombstone(Base):
    """A deleted end user: their calls made before ``created_at`` (the database's clock) never land, even
    spooled (storage/deletion.py)."""

    __tablename__ = "end_user_tombstones"

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    end_user: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
