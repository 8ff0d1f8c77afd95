"""Rate-limit leases in the database: each worker renews its demand per key and reads the other holders'.

One round trip set per worker per renewal (about a second), never per call: proxy/ratelimit.py keeps
the token buckets in memory and calls :func:`renew` from a background task. Times are the database's
clock (Postgres ``clock_timestamp()``), so hosts whose clocks disagree still agree on who is live.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from storage.db import insert_for
from storage.deletion import db_clock
from storage.models import RateLease

PRESENCE = ""  # the key id of a worker's presence row: it is live, whatever keys it serves
FORGET_AFTER_S = 60.0  # rows not renewed for this long are deleted by whoever renews next


@dataclass(frozen=True, slots=True)
class Lease:
    """A live holder's row: who (host, worker) wants how much of which key (requests/s)."""

    key_id: str
    host_id: str
    worker: str
    demand: float


def renew(db: Session, host_id: str, worker: str, demands: Mapping[str, float], ttl_s: float) -> list[Lease]:
    """Write this worker's demand for each key (and its presence); the rows of every holder renewed
    within ``ttl_s`` for those keys and for presence, this worker's included. Commits."""
    now = db_clock(db)
    rows = [
        {"key_id": key, "host_id": host_id, "worker": worker, "demand": float(demand), "renewed_at": now}
        for key, demand in {PRESENCE: 0.0, **demands}.items()
    ]
    stmt = insert_for(db.get_bind().dialect.name)(RateLease).values(rows)
    db.execute(
        stmt.on_conflict_do_update(
            index_elements=["key_id", "host_id", "worker"],
            set_={"demand": stmt.excluded.demand, "renewed_at": stmt.excluded.renewed_at},
        )
    )
    db.execute(delete(RateLease).where(RateLease.renewed_at < now - timedelta(seconds=FORGET_AFTER_S)))
    live = db.execute(
        select(RateLease.key_id, RateLease.host_id, RateLease.worker, RateLease.demand).where(
            RateLease.key_id.in_([PRESENCE, *demands]), RateLease.renewed_at > now - timedelta(seconds=ttl_s)
        )
    ).all()
    db.commit()
    return [Lease(*row) for row in live]


def release(db: Session, host_id: str, worker: str) -> None:
    """Drop this worker's rows (a clean stop): the others take its share at their next renewal."""
    db.execute(delete(RateLease).where(RateLease.host_id == host_id, RateLease.worker == worker))
    db.commit()
