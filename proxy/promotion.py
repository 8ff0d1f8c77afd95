"""The proxy's side of promotion: candidates, canary routing, decisions, direct ``alias@vN`` calls.

The rules and the statistics are in storage/promotion.py; this module applies them to traffic:

- :meth:`Promotion.submit` is what the trainer's deployment request (``candidate: true``) does:
  under ``auto`` it deploys as before; under ``gate``/``canary`` it loads the version into every
  replica, attests it, and names it the alias's candidate without routing all traffic to it.
- :meth:`Promotion.resolve` routes a call: an admin key may name ``alias@vN`` (or ``alias@base``)
  directly, and such calls are tagged ``eval``; everyone else gets the alias's route.
- :meth:`Promotion.arm` sends a sticky share of sessions to a canary (a hash of the session id).
- :meth:`Promotion.decide` takes the decision the evidence allows (after an eval is posted, and
  every few seconds from the housekeeping loop): promote through ``Router.deploy``, hold, or roll
  back. The evals are compared per task family (eval name; ``storage.promotion.eval_families``), and
  one family clearly worse holds (or rolls back) the candidate whatever the others say. Several
  proxy workers may decide at once: the one that clears the candidate row records the event and
  acts; the others find nothing left to do.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import replace
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.attest import Attestor
from proxy.auth import Principal
from proxy.errors import NotFound
from proxy.link_keys import Naming
from proxy.metrics import Metrics
from proxy.routing import Router
from proxy.served import Route, committed_adapter, lora_name
from storage import promotion as store
from storage import verdicts
from storage.alerts import open_alerts
from storage.models import Adapter, Alias, PromotionPolicy

log = logging.getLogger("onthejob.promotion")

EVAL_TAG = "eval"
DIRECT_KEEP_S = 600.0  # a version called directly stays loaded this long after its last direct call


def bucket(project: str, alias: str, session_id: str) -> float:
    """A session's stable place in [0, 1): the canary takes the sessions below its share."""
    digest = hashlib.sha256(f"{project}\x00{alias}\x00{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Promotion:
    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], router: Router, attestor: Attestor, metrics: Metrics
    ) -> None:
        self.sessionmaker = sessionmaker
        self.router = router
        self.attestor = attestor
        self.metrics = metrics
        self.candidates: dict[tuple[str, str], tuple[str, int, float]] = {}  # (project, alias) -> (mode, v, share)
        self._sha: dict[tuple[str, str, int], str] = {}
        self._direct: dict[tuple[str, str, int], float] = {}  # versions called directly (alias@vN) -> when

    # ---- state followed from the database -------------------------------------------
    async def refresh(self) -> None:
        """Candidates and the content hashes of routed versions (every replica follows within a second)."""
        async with self.sessionmaker() as db:
            rows = await db.run_sync(store.policies_with_candidates)
            shas = (
                (
                    await db.execute(
                        select(Adapter.project_id, Adapter.alias, Adapter.version, Adapter.sha256).join(
                            Alias,
                            (Alias.project_id == Adapter.project_id)
                            & (Alias.name == Adapter.alias)
                            & (Alias.deployed_version == Adapter.version),
                        )
                    )
                )
                .tuples()
                .all()
            )
            self.candidates = {
                (p, c.alias): (c.mode, c.candidate_version, c.share) for p, c in rows if c.candidate_version is not None
            }
            missing = [(p, a, v) for (p, a), (_, v, _) in self.candidates.items() if (p, a, v) not in self._sha]
            for p, a, v in missing:
                sha = await db.scalar(
                    select(Adapter.sha256).where(Adapter.project_id == p, Adapter.alias == a, Adapter.version == v)
                )
                if sha:
                    self._sha[(p, a, v)] = sha
        self._sha.update({(p, a, v): s for p, a, v, s in shas})
        self.router.pinned = self.needed_versions()

    def needed_versions(self) -> set[tuple[str, str, int]]:
        """Versions that must stay loaded besides the routed ones (``Router.pinned``): candidates awaiting
        their eval, canaries, and versions this worker served directly in the last ``DIRECT_KEEP_S``.

        Candidates come from the database, so every worker pins them alike; a direct call's version is
        this worker's own memory (another worker may unload it; the next direct call loads it again).
        """
        now = time.monotonic()
        self._direct = {k: t for k, t in self._direct.items() if now - t < DIRECT_KEEP_S}
        return {(p, a, v) for (p, a), (_, v, _) in self.candidates.items()} | set(self._direct)

    # ---- routing a call --------------------------------------------------------------
    async def resolve(self, principal: Principal, model: Any, naming: Naming) -> tuple[Route, Naming]:
        """The route for the model a call names; an admin's ``alias@vN`` or ``alias@base`` directly, as eval."""
        project = principal.project_id
        if principal.role == "admin" and isinstance(model, str) and "@" in model:
            alias, _, which = model.rpartition("@")
            direct = which == "base" or (which[:1] == "v" and which[1:].isdigit())
            if direct and alias:
                base = self.router.resolve(project, alias).base_model  # NotFound names the model
                tags = tuple(dict.fromkeys((*naming.tags, EVAL_TAG)))
                if which == "base":
                    return Route(alias, base, None, base), replace(naming, tags=tags)
                version = int(which[1:])
                await self._ensure_loaded(project, alias, version)
                route = Route(
                    alias, lora_name(project, alias, version), version, base, self._sha.get((project, alias, version))
                )
                return route, replace(naming, tags=tags)
        return self.with_sha(project, self.router.resolve(project, model)), naming

    def with_sha(self, project: str, route: Route) -> Route:
        if route.version is None or route.sha256:
            return route
        return replace(route, sha256=self._sha.get((project, route.alias, route.version)))

    def arm(self, project: str, route: Route, session_id: str, tags: tuple[str, ...]) -> Route:
        """Under ``canary``, a sticky share of the alias's sessions is served by the candidate."""
        hit = self.candidates.get((project, route.alias))
        if hit is None or hit[0] != "canary" or EVAL_TAG in tags or route.version == hit[1]:
            return route
        _, version, share = hit
        if bucket(project, route.alias, session_id) >= share:
            return route
        return Route(
            route.alias,
            lora_name(project, route.alias, version),
            version,
            route.base_model,
            self._sha.get((project, route.alias, version)),
        )

    async def _ensure_loaded(self, project: str, alias: str, version: int) -> None:
        """Load a version into the replicas in rotation (once), and keep it pinned while it is used."""
        key = (project, alias, version)
        if key not in self._direct or not self.router.replicas.loaded_on(lora_name(*key)):
            row = await committed_adapter(self.sessionmaker, project, alias, version)
            if row is None:
                raise NotFound(f"no adapter {alias!r} version {version} in this project", param="model")
            self._sha[key] = row.sha256
            self._direct[key] = time.monotonic()
            self.router.pinned = self.needed_versions()
            await self.router.stage(project, alias, version)
        self._direct[key] = time.monotonic()

    # ---- the trainer's candidates ----------------------------------------------------
    async def submit(self, project: str, alias: str, version: int) -> dict[str, Any]:
        """A newly published version, handled by the alias's policy (auto: deployed at once)."""
        async with self.sessionmaker() as db:
            policy = await db.run_sync(lambda s: store.get_policy(s, project, alias))
            serving = await db.run_sync(lambda s: store.serving_version(s, project, alias))
        if not policy.holds:
            result = await self.router.deploy(project, alias, version)
            why = "auto: every version is routed"
            await self._event(project, alias, version, serving, policy.mode, "promoted", why)
            self.attestor.soon(project, alias, version)
            await self.refresh()  # the routed version's content hash, for the very next call's record
            return {**result, "policy": "auto"}
        await self.router.stage(project, alias, version)
        self.candidates[(project, alias)] = (policy.mode, version, policy.share)  # pinned from now on
        self.router.pinned = self.needed_versions()
        self.attestor.soon(project, alias, version)
        async with self.sessionmaker() as db:
            if policy.candidate_version not in (None, version):
                await _record(
                    db,
                    project,
                    alias,
                    version=policy.candidate_version,
                    serving=serving,
                    mode=policy.mode,
                    decision="superseded",
                    reason=f"v{version} was published before a decision",
                )
            await db.run_sync(lambda s: store.set_candidate(s, project, alias, version))
            decision = "canary" if policy.mode == "canary" else "candidate"
            why = (
                f"{policy.share:.0%} of sessions routed to it"
                if policy.mode == "canary"
                else "loaded, not routed: waiting for its eval"
            )
            await _record(
                db, project, alias, version=version, serving=serving, mode=policy.mode, decision=decision, reason=why
            )
            await db.commit()
        self.candidates[(project, alias)] = (policy.mode, version, policy.share)
        self.metrics.promotion_decisions.labels(decision).inc()
        decided = await self.decide(project, alias)
        return {
            "alias": alias,
            "version": version,
            "policy": policy.mode,
            "serving_version": serving,
            "status": decided or ("canary" if policy.mode == "canary" else "pending"),
        }

    async def manual(self, project: str, alias: str, version: int | None, result: dict[str, Any]) -> None:
        """``onthejob deploy`` (the manual override) was done: record it; it settles a candidate it names."""
        async with self.sessionmaker() as db:
            policy = await db.run_sync(lambda s: store.get_policy(s, project, alias))
            if version is not None and policy.candidate_version == version:
                await db.run_sync(lambda s: store.set_candidate(s, project, alias, None))
                self.candidates.pop((project, alias), None)
            why = "deployed through POST /v1/admin/deployments (onthejob deploy)"
            previous = result.get("previous_version")
            await _record(
                db, project, alias, version=version, serving=previous, mode=policy.mode, decision="manual", reason=why
            )
            await db.commit()
        if version is not None:
            self.attestor.soon(project, alias, version)
        await self.refresh()

    # ---- decisions -------------------------------------------------------------------
    async def decide(self, project: str, alias: str) -> str | None:
        """Take the decision the evidence allows for the alias's candidate; the decision, or None (waiting)."""
        async with self.sessionmaker() as db:
            policy = await db.run_sync(lambda s: store.get_policy(s, project, alias))
            version = policy.candidate_version
            if version is None or not policy.holds:
                return None
            serving = await db.run_sync(lambda s: store.serving_version(s, project, alias))
            alerts = await open_alerts(db, project, alias, version)
            if policy.mode == "gate" and serving is not None:
                # A gated candidate serves no traffic, so its monitors see nothing before it is promoted. What
                # they can see is the serving version it was trained from (held versions are never parents):
                # its drift is the candidate's starting point, so a monitor alert there holds the next promotion
                # until an admin resolves it. (Attestation alerts are about a replica, not the policy.)
                alerts += [a for a in await open_alerts(db, project, alias, serving) if a.kind == "monitor"]
            families = await db.run_sync(
                lambda s: store.eval_families(s, project, alias, version, serving, policy.families)
            )
            evidence = verdicts.family_evidence(families, policy.margin, policy.z) if families else {}
            verdict: str | None
            if alerts:
                evidence["alerts"] = [
                    {"id": a.id, "version": a.version, "kind": a.kind, "name": a.name, "message": a.message}
                    for a in alerts
                ]
                verdict = "held" if policy.mode == "gate" else "rolled_back"
                named = ", ".join(f"{a.kind}/{a.name} on v{a.version}" for a in alerts[:3])
                reason = f"{len(alerts)} open alert(s): {named}{', ...' if len(alerts) > 3 else ''}"
            elif policy.mode == "gate":
                if not families:
                    return None
                verdict, reason = verdicts.gate_families(families, policy.margin, policy.z)
            else:
                since = policy.candidate_since
                assert since is not None
                arms = await db.run_sync(lambda s: store.arm_rewards(s, project, alias, since))
                cand, serve = verdicts.Stats.of(arms.get(version, {})), verdicts.Stats.of(arms.get(serving, {}))
                live = verdicts.compare(cand, serve)
                evidence["live_reward"] = live.to_dict()
                verdict, reason = verdicts.canary_verdict(live, families, policy.margin, policy.z, policy.min_sample)
            if verdict is None:
                return None
            # Claim the decision: only one worker clears this candidate.
            claimed = await db.execute(
                update(PromotionPolicy)
                .where(
                    PromotionPolicy.project_id == project,
                    PromotionPolicy.alias == alias,
                    PromotionPolicy.candidate_version == version,
                )
                .values(candidate_version=None, candidate_since=None)
            )
            if claimed.rowcount != 1:  # type: ignore[attr-defined]
                await db.rollback()  # another worker (or this one's loop) decided first: say what it decided
                return await db.run_sync(lambda s: store.decision_of(s, project, alias, version))
            evidence["policy"] = policy.to_dict()
            await _record(
                db,
                project,
                alias,
                version=version,
                serving=serving,
                mode=policy.mode,
                decision=verdict,
                reason=reason,
                evidence=evidence,
            )
            await db.commit()
        self.candidates.pop((project, alias), None)
        self.metrics.promotion_decisions.labels(verdict).inc()
        log.warning("promotion: %s@v%s %s (%s)", alias, version, verdict, reason)
        if verdict == "promoted":
            await self.router.deploy(project, alias, version)
        await self.refresh()
        return verdict

    async def tick(self) -> None:
        """Decide whatever the evidence allows now, for every candidate (the housekeeping loop calls this)."""
        for project, alias in list(self.candidates):
            try:
                await self.decide(project, alias)
            except Exception as exc:  # noqa: BLE001 - one alias's failure must not stop the others
                log.warning("promotion decision for %s/%s failed: %s", project, alias, exc)

    async def _event(
        self, project: str, alias: str, version: int | None, serving: int | None, mode: str, decision: str, reason: str
    ) -> None:
        async with self.sessionmaker() as db:
            await _record(
                db, project, alias, version=version, serving=serving, mode=mode, decision=decision, reason=reason
            )
            await db.commit()
        self.metrics.promotion_decisions.labels(decision).inc()


async def _record(db: AsyncSession, project: str, alias: str, **event: Any) -> None:
    await db.run_sync(lambda s: store.record_event(s, project, alias, **event))
