"""Attestation: does each engine replica serve ``alias@vN`` with the weights that version names?

An adapter version's folder is never overwritten (trainer/publish.py), but a disk can be written by
someone else, and an engine may have loaded another folder under the same name. The name alone
proves nothing; what the engine computes does. When a version is first loaded (deploy or candidate),
its fingerprint is measured in the background (the deployment does not wait for it) and stored once
(``attestations``): the greedy tokens and their logprobs for a fixed probe prompt, beside the
version's content hash. After every load or reconcile, and every ``ONTHEJOB_ATTEST_EVERY`` seconds,
each replica is probed again under the version's engine-side name. A replica that answers
differently is taken out of rotation for that model (``ReplicaSet.exclude``: calls for it go to the
other replicas) and an alert of kind ``attestation`` is raised (storage/alerts.py: logged, listed by
``GET /v1/admin/alerts``, holding and rolling back promotion); a replica that matches again is put
back.

Logprobs are compared over the prefix where both answers chose the same tokens (a near-tie may flip
a later greedy choice under batching noise; the first token is always compared), within
``TOLERANCE`` nats.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.metrics import Metrics
from proxy.replicas import Replica
from proxy.routing import Router, lora_name
from storage.alerts import raise_alert
from storage.models import Adapter, Alias, Attestation

log = logging.getLogger("onthejob.attest")

PROBE = "Attestation probe. Continue the list: one, two, three,"
PROBE_TOKENS = 8
TOLERANCE = 0.05  # nats: far above batching noise on one engine, far below what other weights change


def same(expected: dict[str, Any], got: dict[str, Any], tolerance: float = TOLERANCE) -> bool:
    """Whether two fingerprints agree: logprobs within ``tolerance`` while the chosen tokens agree."""
    a_tok, b_tok = expected.get("tokens") or [], got.get("tokens") or []
    a_lp, b_lp = expected.get("logprobs") or [], got.get("logprobs") or []
    if not a_tok or not b_tok or len(a_tok) != len(a_lp) or len(b_tok) != len(b_lp):
        return False
    for i, (ta, tb) in enumerate(zip(a_tok, b_tok, strict=False)):
        if abs(float(a_lp[i]) - float(b_lp[i])) > tolerance:
            return False
        if ta != tb:
            return i > 0  # the same logprob for a different token: a near-tie flipped, not other weights
    return True


class Attestor:
    """Measures fingerprints, checks replicas against them, and keeps ``router.excluded`` up to date."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], router: Router, metrics: Metrics) -> None:
        self.sessionmaker = sessionmaker
        self.router = router
        self.metrics = metrics
        self.pending: set[asyncio.Task[Any]] = set()  # fingerprints being measured (held so they finish)
        router.on_reload = self.reloaded

    def soon(self, project: str, alias: str, version: int) -> None:
        """Measure and check the version's fingerprint in the background: a deployment never waits for
        the probe (under load one engine call can take longer than the caller's timeout)."""
        task = asyncio.get_running_loop().create_task(self._record_logged(project, alias, version))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _record_logged(self, project: str, alias: str, version: int) -> None:
        try:
            await self.record(project, alias, version)
        except Exception as exc:  # noqa: BLE001 - the periodic check and the next deploy try again
            log.warning("attesting %s@v%s failed: %s", alias, version, exc)

    async def reloaded(self, replica: Replica) -> None:
        """A probe loaded adapter versions into ``replica`` (after a restart): check what it now serves."""
        try:
            await self.check_all([replica.url])
        except Exception as exc:  # noqa: BLE001 - the periodic check tries again
            log.warning("attestation after reloading %s failed: %s", replica.url, exc)

    async def measure(self, base: str, served_model: str) -> dict[str, Any] | None:
        """The probe's greedy tokens and logprobs on one replica; None if it could not answer."""
        body = {"model": served_model, "prompt": PROBE, "max_tokens": PROBE_TOKENS, "temperature": 0, "logprobs": 0}
        try:
            status, reply = await self.router.upstream.post_json(base, "/v1/completions", body, timeout=60.0)
            if status != 200:
                return None
            lp = reply["choices"][0]["logprobs"]
            return {"tokens": list(lp["tokens"]), "logprobs": [float(x) for x in lp["token_logprobs"]]}
        except Exception as exc:  # noqa: BLE001 - an unreachable or busy replica is not a mismatch
            log.warning("attestation probe of %s on %s failed: %s", served_model, base, exc)
            return None

    async def record(self, project: str, alias: str, version: int) -> dict[str, Any] | None:
        """Store the version's fingerprint if it has none (measured on the first replica that answers),
        then check every replica against it. Returns the stored fingerprint."""
        name = lora_name(project, alias, version)
        async with self.sessionmaker() as db:
            row = await db.get(Attestation, (project, alias, version))
            if row is None:
                sha = await db.scalar(
                    select(Adapter.sha256).where(
                        Adapter.project_id == project, Adapter.alias == alias, Adapter.version == version
                    )
                )
                for base in self.router.upstream.urls:
                    fingerprint = await self.measure(base, name)
                    if fingerprint is not None:
                        row = Attestation(project_id=project, alias=alias, version=version, sha256=sha or "",
                                          fingerprint=fingerprint, replica=base)  # fmt: skip
                        db.add(row)
                        await db.commit()
                        break
            if row is None:
                return None
            expected = dict(row.fingerprint)
        await self.check(project, alias, version, expected)
        return expected

    async def check(
        self, project: str, alias: str, version: int, expected: dict[str, Any], bases: list[str] | None = None
    ) -> dict[str, bool | None]:
        """Probe replicas (all by default) for one version; exclude and alert on a mismatch. Per replica:
        True (matches), False (mismatch), None (did not answer)."""
        name = lora_name(project, alias, version)
        bases = bases or list(self.router.upstream.urls)
        got = await asyncio.gather(*(self.measure(b, name) for b in bases))
        result: dict[str, bool | None] = {}
        for base, fingerprint in zip(bases, got, strict=True):
            if fingerprint is None:
                result[base] = None
                continue
            ok = result[base] = same(expected, fingerprint)
            replicas = self.router.replicas
            if ok:
                if name in replicas.by_url[base].excluded:
                    log.warning("attestation: %s on %s matches again; back in rotation", name, base)
                replicas.include(base, name)
                continue
            replicas.exclude(base, name)
            self.metrics.attestation_failures.labels(alias).inc()
            async with self.sessionmaker() as db:
                await raise_alert(
                    db, project, alias, version, "attestation", "fingerprint",
                    message=f"replica {base} serves {name} with other weights than were attested at deploy; "
                    "it is out of rotation for this version",
                    detail={"replica": base, "expected": expected, "got": fingerprint},
                )  # fmt: skip
                await db.commit()
        return result

    async def check_all(self, bases: list[str] | None = None) -> int:
        """Check every routed or candidate version that has a fingerprint; returns how many were checked."""
        from storage.models import PromotionPolicy

        async with self.sessionmaker() as db:
            live = set((await db.execute(
                select(Alias.project_id, Alias.name, Alias.deployed_version).where(Alias.deployed_version.is_not(None))
            )).tuples().all())  # fmt: skip
            live |= set((await db.execute(
                select(PromotionPolicy.project_id, PromotionPolicy.alias, PromotionPolicy.candidate_version)
                .where(PromotionPolicy.candidate_version.is_not(None))
            )).tuples().all())  # fmt: skip
            rows = [
                r for r in (await db.scalars(select(Attestation))).all() if (r.project_id, r.alias, r.version) in live
            ]
        for row in rows:
            await self.check(row.project_id, row.alias, row.version, dict(row.fingerprint), bases)
        return len(rows)

    def status(self, project: str, alias: str, version: int) -> list[str]:
        """Replicas out of rotation for this version."""
        name = lora_name(project, alias, version)
        return sorted(r.url for r in self.router.replicas.replicas if name in r.excluded)
