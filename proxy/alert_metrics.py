"""Open alerts on the proxy's ``/metrics``, read from storage (the monitors run as their own process).

``onthejob_alerts_open{project, alias, version, kind, check}`` is 1 per open alert (``version``
"base" for the base model); ``onthejob_alerts_opened_timestamp_seconds`` when each was opened.
Read at most once per ``ttl_s`` per scrape, bounded by a timeout; if the database is down the
last figures stay.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.models import Alert

LABELS = ["project", "alias", "version", "kind", "check"]  # check: the monitor or attestation check


class AlertMetrics(Collector):
    """A Prometheus collector over the open alerts; :meth:`refresh` reads storage."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], ttl_s: float = 10.0) -> None:
        self.sessionmaker = sessionmaker
        self.ttl_s = ttl_s
        self.rows: list[tuple[list[str], float]] = []
        self._read_at = -math.inf
        self._lock = asyncio.Lock()

    async def refresh(self, timeout_s: float = 2.0) -> None:
        """Re-read the open alerts if the figures are older than ``ttl_s``; keep the last ones on failure."""
        async with self._lock:
            if time.monotonic() - self._read_at < self.ttl_s:
                return
            query = select(Alert).where(Alert.resolved_at.is_(None)).order_by(Alert.id)
            try:
                async with asyncio.timeout(timeout_s), self.sessionmaker() as db:
                    alerts = (await db.scalars(query)).all()
            except Exception:  # noqa: BLE001 - database down: a scrape still answers, with the last figures
                return
            self.rows = [
                (
                    [a.project_id, a.alias, "base" if a.version is None else str(a.version), a.kind, a.name],
                    a.created_at.timestamp(),
                )
                for a in alerts
            ]
            self._read_at = time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        open_ = GaugeMetricFamily("onthejob_alerts_open", "1 per open alert (monitors, attestation)", labels=LABELS)
        opened = GaugeMetricFamily(
            "onthejob_alerts_opened_timestamp_seconds", "When each open alert was raised", labels=LABELS
        )
        for labels, at in self.rows:
            open_.add_metric(labels, 1.0)
            opened.add_metric(labels, at)
        yield from (open_, opened)
