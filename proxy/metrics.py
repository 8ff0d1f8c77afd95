"""Prometheus metrics, one registry per app (no import-time globals)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("onthejob_requests", "Calls answered", ["route", "status"], registry=r)
        self.terminations = Counter("onthejob_terminations", "Recorded calls by termination", ["reason"], registry=r)
        self.records_spooled = Counter("onthejob_records_spooled", "Records fsync'd to the spool", registry=r)
        self.records_written = Counter("onthejob_records_written", "Records committed to the database", registry=r)
        self.records_dropped = Counter(
            "onthejob_records_dropped", "Records served but not recorded (must stay 0)", ["reason"], registry=r
        )
        self.spool_full_rejections = Counter(
            "onthejob_spool_full_rejections", "Calls refused because the spool is full", registry=r
        )
        self.spool_depth = Gauge("onthejob_spool_depth", "Records in the spool, not yet in the database", registry=r)
        self.spool_age = Gauge("onthejob_spool_oldest_age_seconds", "Age of the oldest spooled record", registry=r)
        self.spool_bytes = Gauge("onthejob_spool_bytes", "Bytes on disk in the spool", registry=r)
        self.db_up = Gauge("onthejob_db_up", "1 if the last database write succeeded", registry=r)
        self.upstream_up = Gauge(
            "onthejob_upstream_up", "1 if the engine answered the last probe", ["upstream"], registry=r
        )
        self.latency = Histogram(
            "onthejob_request_seconds",
            "Time to the last byte",
            ["route"],
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
        )
        self.feedback_orphans = Gauge(
            "onthejob_feedback_orphans", "Pending feedback older than its TTL (target never landed)", registry=r
        )
        self.adapter_loads = Counter("onthejob_adapter_loads", "Adapter loads into engines", ["result"], registry=r)
        self._terminations: dict[str, Any] = {}

    def termination(self, reason: str) -> Any:
        """The per-reason child of ``terminations`` (``labels()`` costs more than the increment; once per call)."""
        child = self._terminations.get(reason)
        if child is None:
            child = self._terminations[reason] = self.terminations.labels(reason)
        return child
