"""The link keys of calls just answered, shared with the other proxy hosts (proxy/link_feed.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


class LinkEntry(Base):
    """A recorded call's link key, written for the other hosts as soon as it is answered.

    A host writes one row per call it answered (per choice), within milliseconds and never in the
    call's way, while another host shares the database; a turn sent to another host finds its parent
    here before the answering host's recorder has moved the call into ``completions``. Rows are a
    bridge, not a record: read only while young (:data:`proxy.link_feed.READ_S`), deleted by the host
    that wrote them after :data:`proxy.link_feed.KEEP_S`, and with their sessions and end users.
    """

    __tablename__ = "link_entries"
    __table_args__ = (
        Index("ix_link_entries_written", "host_id", "written_at"),  # each host prunes its own rows
        Index("ix_link_entries_session", "project_id", "session_id"),  # deletes by session
    )

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    link_key: Mapped[str] = mapped_column(String(64), primary_key=True)  # as completions.link_key
    call_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # completions.id, once it lands
    session_id: Mapped[str] = mapped_column(String(200))
    task_id: Mapped[str | None] = mapped_column(String(200), default=None)
    end_user: Mapped[str | None] = mapped_column(String(200), default=None)  # stored key, as completions.end_user
    created_at: Mapped[str | None] = mapped_column(String(40), default=None)  # the call's time, its host's clock (ISO)
    host_id: Mapped[str] = mapped_column(String(255))
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # the database's clock
