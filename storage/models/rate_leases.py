"""The rate-limit leases of the proxy hosts sharing one database (proxy/ratelimit.py, storage/rate_leases.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, String
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


class RateLease(Base):
    """One worker's lease on a key's rate limit: its recent demand, renewed every second or so.

    Every ``serve`` worker of every host renews a row per key it saw lately, and one with ``key_id``
    ``""`` (its presence, so hosts with no traffic count too); a row not renewed within a few seconds
    is a holder gone. Each worker takes its share of a key's limit from the rows of the key's live
    holders (proxy.ratelimit.fair_shares), so no call waits on the database.
    """

    __tablename__ = "rate_leases"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)  # api_keys.id; "": presence
    host_id: Mapped[str] = mapped_column(String(255), primary_key=True)  # Settings.host_id
    worker: Mapped[str] = mapped_column(String(64), primary_key=True)  # one per serve worker process
    demand: Mapped[float] = mapped_column(Float, default=0.0)  # requests/s it was asked to admit lately
    renewed_at: Mapped[datetime] = mapped_column()  # by the database's clock
