"""Promotion: held-out evaluations, policies, decisions, and what each engine replica attests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, utcnow


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
