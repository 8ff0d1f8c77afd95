"""Attestation: does each engine replica serve ``alias@vN`` with the weights that version names?

An adapter version's folder is never overwritten (trainer/publish.py), but a disk can be written by
someone else, and an engine may have loaded another folder under the same name. The name alone
proves nothing; what the engine computes does. When a version is first loaded (deploy or candidate),
its fingerprint is measured in the background (the deployment does not wait for it) and stored once
(``attestations``), beside the version's content hash. After every load or reconcile, and every
``ONTHEJOB_ATTEST_EVERY`` seconds, each replica is probed again under the version's engine-side name.

The fingerprint, its probe, its noise and its tolerance are proxy/fingerprint.py's (pure functions).

A replica that answers beyond the tolerance raises an alert of kind ``attestation``
(storage/alerts.py: logged, listed by ``GET /v1/admin/alerts``, holding and rolling back promotion),
and is taken out of rotation for that model (``ReplicaSet.exclude``) when another replica serves it.
A check never black-holes a model: when no other replica may serve it, the alias is routed to its
previous attested version while one is loaded (``Router.fallbacks``, as a canary's rollback would),
and failing that the replica keeps serving, marked suspect. A replica that matches again is put back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.fingerprint import calibrate, distance, kind_of, parse_probe, probe_body, repeats, same, tolerance_of
from proxy.metrics import Metrics
from proxy.replicas import Replica
from proxy.routing import Router
from proxy.served import lora_name
from storage.alerts import raise_alert
from storage.db import insert_for
from storage.models import Adapter, Alias, Attestation

log = logging.getLogger("onthejob.attest")


class Attestor:
    """Measures fingerprints, checks replicas against them, and keeps ``router.excluded`` up to date."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], router: Router, metrics: Metrics) -> None:
        self.sessionmaker = sessionmaker
        self.router = router
        self.metrics = metrics
        # Fingerprints being measured, by (project, alias, version): held so they finish, one at a time each.
        self.pending: dict[tuple[str, str, int], asyncio.Task[Any]] = {}
        # The largest finite noise a calibration measured on each replica (by URL): the engine's, whatever version.
        self.noise_seen: dict[str, float] = {}
        router.on_reload = self.reloaded

    def soon(self, project: str, alias: str, version: int) -> None:
        """Measure and check the version's fingerprint in the background: a deployment never waits for
        the probe (under load one engine call can take longer than the caller's timeout). Once at a time
        per version: a version whose probes all failed is tried again by the periodic check (:meth:`check_all`)."""
        key = (project, alias, version)
        if key in self.pending:
            return
        task = self.pending[key] = asyncio.get_running_loop().create_task(self._record_logged(*key))
        task.add_done_callback(lambda _: self.pending.pop(key, None))

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

    async def measure(self, base: str, served_model: str, kind: str = "forced") -> dict[str, Any] | None:
        """One probe's fingerprint on one replica; None if it could not answer."""
        try:
            body = probe_body(served_model, kind)
            status, reply = await self.router.upstream.post_json(base, "/v1/completions", body, timeout=60.0)
            if status != 200:
                log.warning(
                    "attestation probe of %s on %s answered %s: %s", served_model, base, status, str(reply)[:300]
                )
                return None
            return parse_probe(reply, kind)
        except Exception as exc:  # noqa: BLE001 - an unreachable or busy replica is not a mismatch
            log.warning("attestation probe of %s on %s failed: %s %s", served_model, base, type(exc).__name__, exc)
            return None

    async def beside(self, base: str, body: dict[str, Any]) -> None:
        """One filler call sent beside the concurrent probes; its answer (or failure) does not matter."""
        try:
            await self.router.upstream.post_json(base, "/v1/completions", body, timeout=60.0)
        except Exception as exc:  # noqa: BLE001 - the probes beside it are what is measured
            log.debug("attestation filler call on %s failed: %s", base, exc)

    async def calibrated(
        self, base: str, project: str, alias: str, version: int, base_model: str | None
    ) -> dict[str, Any] | None:
        """The version's fingerprint with its noise (:func:`calibrate`): probed on ``base`` in a row and at once
        among filler calls to the version and the base model (:func:`repeats`: the batches then mix shapes and
        adapters, as under load); the same probe of the base model and the previous version, where the replica
        lists them, gives the separation. None if the replica did not answer."""
        name = lora_name(project, alias, version)
        models = [name, base_model] if base_model else [name]
        samples = await repeats(lambda: self.measure(base, name), lambda body: self.beside(base, body), models)
        if samples is None:
            return None
        listed = self.router.replicas.by_url[base].models
        others: dict[str, dict[str, Any]] = {}
        candidates = {"base": base_model} if base_model else {}
        if version > 1:
            candidates[f"v{version - 1}"] = lora_name(project, alias, version - 1)
        for label, model in candidates.items():
            if model in listed or label == "base":
                fp = await self.measure(base, model)
                if fp is not None:
                    others[label] = fp
        known = max(self.noise_seen.get(base, 0.0), await self._alias_noise(project, alias, version))
        fingerprint = calibrate(samples, others, known)
        if fingerprint["noise"] != float("inf"):
            self.noise_seen[base] = max(self.noise_seen.get(base, 0.0), fingerprint["noise"])
        if fingerprint["verdict"] == "unverifiable":
            log.warning(
                "attestation of %s is unverifiable: noise %.4g nats, tolerance %.4g, separation %s",
                name,
                fingerprint["noise"],
                fingerprint["tolerance"],
                fingerprint["separation"],
            )
        else:
            log.info(
                "attested %s: noise %.4g nats, tolerance %.4g, separation %s",
                name,
                fingerprint["noise"],
                fingerprint["tolerance"],
                fingerprint["separation"],
            )
        return fingerprint

    async def _alias_noise(self, project: str, alias: str, version: int) -> float:
        """The largest finite noise stored with the alias's earlier fingerprints of the same probe (the last 20)."""
        async with self.sessionmaker() as db:
            stored = (await db.scalars(_earlier(Attestation.fingerprint, project, alias, version).limit(20))).all()
        noises = [fp.get("noise") for fp in stored if isinstance(fp, dict) and fp.get("kind") == "forced"]
        return max((float(n) for n in noises if isinstance(n, int | float) and n != float("inf")), default=0.0)

    async def record(self, project: str, alias: str, version: int) -> dict[str, Any] | None:
        """Store the version's fingerprint if it has none (measured on the first replica that answers),
        then check every replica against it. Returns the stored fingerprint.

        No database session is held while probing (seconds on a busy engine): the row is read, the
        probes run, and the fingerprint is inserted in a fresh session; when another worker stored one
        meanwhile, that one is kept and used.
        """
        name = lora_name(project, alias, version)
        async with self.sessionmaker() as db:
            row = await db.get(Attestation, (project, alias, version))
            expected = dict(row.fingerprint) if row is not None else None
            adapter = None
            if row is None:
                adapter = (
                    await db.execute(
                        select(Adapter.sha256, Adapter.base_model).where(
                            Adapter.project_id == project, Adapter.alias == alias, Adapter.version == version
                        )
                    )
                ).first()
        if expected is None:
            sha, base_model = (adapter[0] or "", adapter[1]) if adapter is not None else ("", None)
            for base in self.router.upstream.urls:
                fingerprint = await self.calibrated(base, project, alias, version, base_model)
                if fingerprint is not None:
                    expected = await self._store(project, alias, version, sha, fingerprint, base)
                    break
        if expected is None:
            log.warning("%s was not attested: no replica answered its probes", name)
            return None
        await self.check(project, alias, version, expected)
        return expected

    async def _store(
        self, project: str, alias: str, version: int, sha: str, fingerprint: dict[str, Any], base: str
    ) -> dict[str, Any]:
        """Insert the fingerprint unless one is there already; the one stored (the first wins)."""
        async with self.sessionmaker() as db:
            stmt = insert_for(db.get_bind().dialect.name)(Attestation).values(
                project_id=project, alias=alias, version=version, sha256=sha, fingerprint=fingerprint, replica=base
            )
            await db.execute(stmt.on_conflict_do_nothing())
            await db.commit()
            row = await db.get(Attestation, (project, alias, version), populate_existing=True)
            return dict(row.fingerprint) if row is not None else fingerprint

    async def _previous_attested(self, project: str, alias: str, version: int) -> int | None:
        """The newest earlier attested version of the alias that a replica may serve now."""
        async with self.sessionmaker() as db:
            versions = (await db.scalars(_earlier(Attestation.version, project, alias, version))).all()
        for v in versions:
            if self.router.replicas.servable(lora_name(project, alias, v)):
                return int(v)
        return None

    async def check(
        self, project: str, alias: str, version: int, expected: dict[str, Any], bases: list[str] | None = None
    ) -> dict[str, bool | None]:
        """Probe replicas (all by default) for one version; on a mismatch alert, and exclude the replica
        (or, when it is the last one, fall back to the previous attested version, or keep it serving).
        Per replica: True (matches), False (mismatch), None (did not answer)."""
        name = lora_name(project, alias, version)
        kind = kind_of(expected)
        bases = bases or list(self.router.upstream.urls)
        got = await asyncio.gather(*(self.measure(b, name, kind) for b in bases))
        result: dict[str, bool | None] = {}
        replicas, router = self.router.replicas, self.router
        for base, fingerprint in zip(bases, got, strict=True):
            if fingerprint is None:
                result[base] = None
                continue
            ok = result[base] = same(expected, fingerprint)
            if ok:
                if name in replicas.by_url[base].excluded | replicas.by_url[base].suspect:
                    log.warning("attestation: %s on %s matches again; back in rotation", name, base)
                replicas.include(base, name)
                if router.fallbacks.get((project, alias), (None, None))[0] == version:
                    del router.fallbacks[(project, alias)]
                    log.warning("attestation: %s matches again; %s is routed to it again", name, alias)
                continue
            self.metrics.attestation_failures.labels(alias).inc()
            if replicas.exclude(base, name):
                action = "it is out of rotation for this version"
            elif (
                router.deployed(project, alias) == version
                and (previous := await self._previous_attested(project, alias, version)) is not None
            ):
                router.fallbacks[(project, alias)] = (version, previous)
                action = (
                    f"no other replica serves it: calls for {alias!r} are served by v{previous} (attested) meanwhile"
                )
            else:
                action = "no other replica or attested earlier version serves it: it keeps serving (suspect)"
            dist = distance(expected, fingerprint) if kind != "greedy" else None
            dist = dist if dist != float("inf") else None  # other tokens: another tokenizer, or a broken reply
            log.warning(
                "attestation: %s on %s differs (distance %s, tolerance %.4g): %s",
                name,
                base,
                dist,
                tolerance_of(expected),
                action,
            )
            async with self.sessionmaker() as db:
                await raise_alert(
                    db,
                    project,
                    alias,
                    version,
                    "attestation",
                    "fingerprint",
                    message=f"replica {base} serves {name} with other weights than were attested at deploy; {action}",
                    value=dist,
                    threshold=tolerance_of(expected),
                    detail={"replica": base, "expected": expected, "got": fingerprint, "action": action},
                )
                await db.commit()
        return result

    async def check_all(self, bases: list[str] | None = None) -> int:
        """Check every routed or candidate version that has a fingerprint; returns how many were checked.
        One that has none (every probe failed when it was loaded: a busy engine) is measured again."""
        from storage.models import PromotionPolicy

        async with self.sessionmaker() as db:
            live = set(
                (
                    await db.execute(
                        select(Alias.project_id, Alias.name, Alias.deployed_version).where(
                            Alias.deployed_version.is_not(None)
                        )
                    )
                )
                .tuples()
                .all()
            )
            live |= set(
                (
                    await db.execute(
                        select(
                            PromotionPolicy.project_id, PromotionPolicy.alias, PromotionPolicy.candidate_version
                        ).where(PromotionPolicy.candidate_version.is_not(None))
                    )
                )
                .tuples()
                .all()
            )
            stored = (await db.scalars(select(Attestation))).all()
        rows = [r for r in stored if (r.project_id, r.alias, r.version) in live]
        for project, alias, version in live - {(r.project_id, r.alias, r.version) for r in stored}:
            if version is not None:
                self.soon(project, alias, version)
        for row in rows:
            await self.check(row.project_id, row.alias, row.version, dict(row.fingerprint), bases)
        return len(rows)

    def status(self, project: str, alias: str, version: int) -> list[str]:
        """Replicas out of rotation for this version (a suspect one kept serving is not among them)."""
        name = lora_name(project, alias, version)
        return sorted(r.url for r in self.router.replicas.replicas if name in r.excluded)


def _earlier(column: Any, project: str, alias: str, version: int) -> Select[Any]:
    """``column`` of the alias's attestations before ``version``, newest first."""
    mine = (Attestation.project_id == project, Attestation.alias == alias, Attestation.version < version)
    return select(column).where(*mine).order_by(Attestation.version.desc())
