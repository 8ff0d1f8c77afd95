"""The trainer's step metrics on the proxy's ``/metrics``, read from storage.

The trainer is a batch job that may run anywhere (another host, under torchrun), so
it exports nothing itself: every step it takes is a ``training_steps`` row. A scrape
reads the newest step of each (project, alias) at most once per ``ttl_s`` (one
query, bounded by a timeout; if the database is down the last figures stay) and
exports them as gauges labelled by project and alias.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.models import TrainingRun, TrainingStep

# Step metric → (exported name, help). Exclusions are exported separately, by reason.
FIELDS = {
    "loss": ("onthejob_trainer_loss", "Loss of the newest training step"),
    "reward_mean": ("onthejob_trainer_reward_mean", "Mean reward of the trajectories the newest step kept"),
    "ratio_mean": ("onthejob_trainer_ratio_mean", "Mean pi_prox/mu ratio over trained tokens"),
    "ratio_max": ("onthejob_trainer_ratio_max", "Largest pi_prox/mu ratio over trained tokens"),
    "clipped_frac": ("onthejob_trainer_clipped_fraction", "Share of trained tokens whose ratio was clipped"),
    "ess": ("onthejob_trainer_ess", "Normalised effective sample size of the ratios"),
    "kl_mu_pi": ("onthejob_trainer_kl_mu_pi", "KL(mu || pi) estimated on trained tokens"),
    "tokens": ("onthejob_trainer_tokens", "Tokens the newest step trained on"),
    "trajectories": ("onthejob_trainer_trajectories", "Trajectories the newest step trained on"),
}
LABELS = ["project", "alias"]


@dataclass(frozen=True)
class StepRow:
    project: str
    alias: str
    step: int
    adapter_version: int | None
    created_at: float  # unix seconds
    metrics: dict[str, Any]


class TrainerMetrics(Collector):
    """A Prometheus collector over the newest step per (project, alias); :meth:`refresh` reads storage."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], ttl_s: float = 10.0) -> None:
        self.sessionmaker = sessionmaker
        self.ttl_s = ttl_s
        self.rows: list[StepRow] = []
        self._read_at = -math.inf
        self._lock = asyncio.Lock()

    async def refresh(self, timeout_s: float = 2.0) -> None:
        """Re-read storage if the figures are older than ``ttl_s``; keep the last ones on any failure."""
        async with self._lock:
            if time.monotonic() - self._read_at < self.ttl_s:
                return
            try:
                async with asyncio.timeout(timeout_s):
                    self.rows = await self._read()
            except Exception:  # noqa: BLE001 - database down: a scrape still answers, with the last figures
                return
            self._read_at = time.monotonic()

    async def _read(self) -> list[StepRow]:
        newest = (
            select(TrainingRun.project_id, TrainingRun.alias, func.max(TrainingStep.id).label("step_id"))
            .join(TrainingStep, TrainingStep.run_id == TrainingRun.id)
            .group_by(TrainingRun.project_id, TrainingRun.alias)
            .subquery()
        )
        query = select(newest.c.project_id, newest.c.alias, TrainingStep).join(
            TrainingStep, TrainingStep.id == newest.c.step_id
        )
        async with self.sessionmaker() as db:
            rows = (await db.execute(query)).all()
        return [
            StepRow(p, a, s.step, s.adapter_version, s.created_at.timestamp(), dict(s.metrics or {}))
            for p, a, s in rows
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        step = GaugeMetricFamily("onthejob_trainer_step", "Number of the newest training step", labels=LABELS)
        version = GaugeMetricFamily(
            "onthejob_trainer_adapter_version", "Adapter version the newest step published", labels=LABELS
        )
        when = GaugeMetricFamily(
            "onthejob_trainer_step_timestamp_seconds", "When the newest step was recorded", labels=LABELS
        )
        fields = {k: GaugeMetricFamily(name, doc, labels=LABELS) for k, (name, doc) in FIELDS.items()}
        excluded = GaugeMetricFamily(
            "onthejob_trainer_excluded", "Trajectories the newest step excluded, by reason", labels=[*LABELS, "reason"]
        )
        for row in self.rows:
            labels = [row.project, row.alias]
            step.add_metric(labels, row.step)
            when.add_metric(labels, row.created_at)
            if row.adapter_version is not None:
                version.add_metric(labels, row.adapter_version)
            for key, family in fields.items():
                value = row.metrics.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    family.add_metric(labels, float(value))
            for reason, count in (row.metrics.get("excluded") or {}).items():
                excluded.add_metric([*labels, str(reason)], float(count))
        yield from (step, version, when, *fields.values(), excluded)
