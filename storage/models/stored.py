"""What the stored form of calls shares between rows (storage/stored_form.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base, utcnow


class StoredPrefix(Base):
    """A prefix many calls of one project begin with (a harness's system prompt and tool list), stored once.

    Content-addressed: ``hash`` is the sha256 of ``body``'s JSON text; ``refs`` counts the ``completions``
    rows that reference it (the recorder adds, deletion and retention take away; at 0 the row goes). Never
    shared across projects: a project's rows reference its own copy.
    """

    __tablename__ = "stored_prefixes"

    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    body: Mapped[dict[str, Any]] = mapped_column()  # {"messages": [the leading ones], <key>: <value>, ...}
    refs: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
