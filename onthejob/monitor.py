"""``onthejob monitor [--watch]``: the monitors as their own process.

Each pass reads every alias's windows from the database (``storage.monitor_store.run_monitors``),
opens or refreshes alerts and prints one line per breach. With ``--drift-engine URL`` it also
measures drift from the base model (``kl_base``): for a sample of each version's recent calls,
the engine scores the sampled tokens under the base model (``prompt_logprobs``, one prefill, no
generation) and the estimate is the mean of log μ − log π_base over those tokens, μ being the
behaviour logprob the proxy recorded. That is an unbiased sample estimate of KL(π_v ‖ π_base)
only for calls sampled at temperature 1 without top-k/top-p/min-p; other calls are not sampled.
Scores are cached per call, so a ``--watch`` pass probes only new calls.

It runs apart from the proxy: proxy replicas stay on the serving path only, and one monitor
process per deployment raises each alert once (compose service ``monitor``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from storage.db import async_engine
from storage.models import Alias, Completion
from storage.monitor_store import VERSIONS_WATCHED, AliasReport, monitored_aliases, run_monitors, versions_with_traffic
from storage.monitors import Estimate, ratio_estimate

log = logging.getLogger("onthejob.monitor")


@dataclass
class MonitorCommand:
    db_url: str
    project: str | None = None
    alias: str | None = None
    watch: bool = False
    interval_s: float = 60.0
    drift_engine: str | None = None
    drift_sample: int = 32
    as_json: bool = False


@dataclass
class DriftProbe:
    """KL(π_v ‖ π_base) per version on a sample of recorded calls, scored by the engine's base model."""

    engine: str
    sample: int = 32  # at least the default min_sessions: kl_base is compared only over that many calls
    cache: dict[str, tuple[float, float]] = field(default_factory=dict)  # call id → (Σ log μ − log π_base, tokens)

    async def estimates(self, db: AsyncSession, project: str, alias: str) -> dict[int | None, Estimate]:
        base = await db.scalar(select(Alias.base_model).where(Alias.project_id == project, Alias.name == alias))
        if base is None:
            return {}
        versions = await versions_with_traffic(db, project, alias)
        watched = [v for v in versions if v is None] + [v for v in versions if v is not None][-VERSIONS_WATCHED:]
        out: dict[int | None, Estimate] = {}
        async with httpx.AsyncClient(timeout=60) as client:
            for version in watched:
                calls = await self._recent(db, project, alias, version)
                pairs = [p for c in calls if (p := await self._score(client, base, c)) is not None]
                est = ratio_estimate(pairs)
                if est is not None:
                    out[version] = est
        return out

    async def _recent(self, db: AsyncSession, project: str, alias: str, version: int | None) -> Sequence[Completion]:
        query = (
            select(Completion)
            .where(
                Completion.project_id == project,
                Completion.alias == alias,
                Completion.status_code == 200,
                Completion.adapter_version.is_(None) if version is None else Completion.adapter_version == version,
            )
            .order_by(Completion.created_at.desc())
            .limit(self.sample * 4)
        )
        rows = [c for c in (await db.scalars(query)).all() if _plain_sampling(c)]
        return rows[: self.sample]

    async def _score(self, client: httpx.AsyncClient, base: str, call: Completion) -> tuple[float, float] | None:
        if call.id in self.cache:
            return self.cache[call.id]
        choice = call.choices[0]
        ids, mu = list(choice.get("token_ids") or ()), list(choice.get("logprobs") or ())
        if not ids or len(mu) != len(ids) or any(m is None for m in mu) or not call.prompt_token_ids:
            return None
        prompt = list(call.prompt_token_ids)
        body = {"model": base, "prompt": prompt + ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}
        try:
            resp = await client.post(f"{self.engine}/v1/completions", json=body)
            scored = resp.json()["choices"][0]["prompt_logprobs"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            log.warning("drift probe: the engine did not score call %s: %s", call.id, exc)
            return None
        diffs = 0.0
        for pos, (token, m) in enumerate(zip(ids, mu, strict=True)):
            entry = (scored[len(prompt) + pos] or {}).get(str(token))
            if entry is None:
                return None
            diffs += float(m) - float(entry["logprob"])
        self.cache[call.id] = (diffs, float(len(ids)))
        return self.cache[call.id]


def _plain_sampling(call: Completion) -> bool:
    """Sampled from the model's own distribution: the only calls whose μ makes the KL estimate unbiased."""
    s = call.sampling or {}

    def value(key: str, default: float) -> float:
        v = s.get(key)
        return float(v) if isinstance(v, int | float) else default

    return (
        value("temperature", 1.0) == 1.0
        and value("top_p", 1.0) == 1.0
        and value("top_k", -1.0) in (-1.0, 0.0)
        and value("min_p", 0.0) == 0.0
        and bool(call.choices)
    )


async def monitor_pass(
    sessionmaker: async_sessionmaker[AsyncSession], cmd: MonitorCommand, probe: DriftProbe | None
) -> list[tuple[str, AliasReport]]:
    """One pass over every watched alias; commits the alerts it opened or refreshed."""
    out = []
    async with sessionmaker() as db:
        targets = await monitored_aliases(db, cmd.project)
    for project, alias in targets:
        if cmd.alias is not None and alias != cmd.alias:
            continue
        async with sessionmaker() as db:
            extra = {v: {"kl_base": e} for v, e in (await probe.estimates(db, project, alias)).items()} if probe else {}
            report = await run_monitors(db, project, alias, extra=extra)
            await db.commit()
        out.append((project, report))
    return out


def _print(reports: list[tuple[str, AliasReport]], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{"project": p, **r.to_dict()} for p, r in reports]), flush=True)
        return
    stamp = time.strftime("%H:%M:%S")
    for project, report in reports:
        versions = ", ".join("base" if v is None else f"v{v}" for v in report.windows) or "no traffic"
        breaches = [(v, b) for v, found in report.breaches.items() for b in found]
        print(f"{stamp} {project}/{report.alias}: windows {versions}; {len(breaches)} breach(es)", flush=True)
        for v, b in breaches:
            print(f"  {b.message(v)}", flush=True)


async def run_async(cmd: MonitorCommand) -> int:
    engine = async_engine(cmd.db_url)
    sessionmaker = async_sessionmaker(engine, expire_on_commit=False)
    probe = DriftProbe(cmd.drift_engine, cmd.drift_sample) if cmd.drift_engine else None
    try:
        while True:
            started = time.monotonic()
            try:
                _print(await monitor_pass(sessionmaker, cmd, probe), cmd.as_json)
            except Exception:  # noqa: BLE001 - a watcher outlives a bad pass (database restarting, say)
                if not cmd.watch:
                    raise
                log.exception("monitor pass failed; next in %.0f s", cmd.interval_s)
            if not cmd.watch:
                return 0
            await asyncio.sleep(max(0.0, cmd.interval_s - (time.monotonic() - started)))
    finally:
        await engine.dispose()


def run(cmd: MonitorCommand) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(run_async(cmd))
