"""Admin routes for promotion: an alias's policy, evals per version, the decisions taken, attestations."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from proxy.deps import AdminDep, DbDep, PathId, StateDep
from proxy.errors import InvalidRequest, NotFound
from storage import promotion as store
from storage.models import NO_NUL, Adapter, Alias, Attestation

router = APIRouter(prefix="/v1/admin", tags=["admin"])

# A version in a path: its number, or "base" for the alias's base model.
VersionPath = Annotated[str, Path(max_length=12, description="a version number, or base")]


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "gate", "canary"]
    margin: float | None = Field(None, ge=0, description="how much worse than serving still passes (eval units)")
    z: float | None = Field(None, gt=0, description="standard errors that make evidence clear")
    share: float | None = Field(None, gt=0, lt=1, description="canary: the share of sessions routed to the candidate")
    min_sample: int | None = Field(None, ge=1, le=10**6, description="canary: graded sessions per arm before deciding")
    eval: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None,
        description="what the trainer evaluates each new version with: one eval, or a list of them (one per task "
        "family, each its own name)",
    )
    families: list[Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]] | None = Field(
        None,
        min_length=1,
        max_length=50,
        description="gate: the eval names (task families) every candidate waits for and is compared on; "
        "null: every name both versions have",
    )


ItemId = Annotated[str, Field(max_length=200, pattern=NO_NUL)]
Score = Annotated[float, Field(allow_inf_nan=False)]


class EvalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("default", min_length=1, max_length=200, pattern=NO_NUL, description="the eval set")
    n: int = Field(ge=1, le=10**9)
    mean: float = Field(allow_inf_nan=False)
    stderr: float = Field(ge=0, allow_inf_nan=False)
    grader: str = Field("", max_length=200, pattern=NO_NUL)
    source: str = Field("", max_length=200, pattern=NO_NUL)
    scores: dict[ItemId, Score] = Field(
        default_factory=dict, max_length=100_000, description="per-item scores by item id (paired comparison)"
    )
    detail: dict[str, Any] = Field(default_factory=dict)


async def _alias_known(db: Any, project: str, alias: str) -> None:
    if await db.scalar(select(Alias.id).where(Alias.project_id == project, Alias.name == alias)) is None:
        raise NotFound(f"no alias {alias!r} in this project: list them at GET /v1/admin/aliases", param="alias")


async def _version_known(db: Any, project: str, alias: str, version: int | None) -> None:
    if version is None:
        return
    row = await db.scalar(
        select(Adapter.id).where(
            Adapter.project_id == project, Adapter.alias == alias, Adapter.version == version, Adapter.committed()
        )
    )
    if row is None:
        raise NotFound(f"no adapter {alias!r} version {version}: list them at GET /v1/admin/adapters", param="version")


def _version(raw: str) -> int | None:
    if raw == "base":
        return None
    if not raw.isdigit() or not 1 <= int(raw) < 2**31:
        raise NotFound(f"no version {raw!r}: a version is a number, or base", param="version")
    return int(raw)


@router.get("/aliases/{alias}/policy")
async def get_policy(alias: PathId, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """The alias's promotion policy (auto when none was set) and its candidate, if one is under way."""
    await _alias_known(db, admin.project_id, alias)
    policy = await db.run_sync(lambda s: store.get_policy(s, admin.project_id, alias))
    return policy.to_dict()


@router.put("/aliases/{alias}/policy")
async def set_policy(alias: PathId, item: PolicyIn, admin: AdminDep, db: DbDep, st: StateDep) -> dict[str, Any]:
    """auto (route every version), gate (route after its eval) or canary (a share of sessions first)."""
    await _alias_known(db, admin.project_id, alias)
    config = item.model_dump(exclude={"mode"}, exclude_unset=True)
    try:
        policy = await db.run_sync(lambda s: store.set_policy(s, admin.project_id, alias, item.mode, config))
    except store.PolicyError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    await db.commit()
    await st.promotion.refresh()
    return policy.to_dict()


@router.post("/aliases/{alias}/versions/{version}/evals", status_code=201)
async def post_eval(
    alias: PathId, version: VersionPath, item: EvalIn, admin: AdminDep, db: DbDep, st: StateDep
) -> dict[str, Any]:
    """Store one eval result of a version (mean ± standard error); a candidate waiting for it is decided."""
    v = _version(version)
    await _alias_known(db, admin.project_id, alias)
    await _version_known(db, admin.project_id, alias, v)
    row = await db.run_sync(lambda s: store.add_eval(s, admin.project_id, alias, v, **item.model_dump()))
    await db.commit()
    out = store.eval_to_dict(row)
    out["decision"] = await st.promotion.decide(admin.project_id, alias)
    return out


@router.get("/aliases/{alias}/versions/{version}/evals")
async def list_version_evals(alias: PathId, version: VersionPath, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    v = _version(version)
    await _alias_known(db, admin.project_id, alias)
    rows = await db.run_sync(lambda s: store.list_evals(s, admin.project_id, alias, v))
    return {"object": "list", "data": [store.eval_to_dict(r) for r in rows]}


@router.get("/aliases/{alias}/promotions")
async def list_promotions(alias: PathId, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """Every promotion decision for the alias, oldest first, with the evidence it was taken on."""
    await _alias_known(db, admin.project_id, alias)
    rows = await db.run_sync(lambda s: store.list_events(s, admin.project_id, alias))
    return {"object": "list", "data": [store.event_to_dict(r) for r in rows]}


@router.post("/aliases/{alias}/promotions/decide")
async def decide_now(alias: PathId, admin: AdminDep, db: DbDep, st: StateDep) -> dict[str, Any]:
    """Take the decision the evidence allows for the alias's candidate now (e.g. right after a monitor pass),
    rather than at the proxy's next check; ``decision`` is null when no candidate is under way or it waits."""
    await _alias_known(db, admin.project_id, alias)
    policy = await db.run_sync(lambda s: store.get_policy(s, admin.project_id, alias))
    decision = await st.promotion.decide(admin.project_id, alias)
    return {"alias": alias, "version": policy.candidate_version, "decision": decision}


@router.get("/aliases/{alias}/attestations")
async def list_attestations(alias: PathId, admin: AdminDep, db: DbDep, st: StateDep) -> dict[str, Any]:
    """Each attested version's content hash and fingerprint, and the replicas out of rotation for it."""
    await _alias_known(db, admin.project_id, alias)
    query = select(Attestation).where(Attestation.project_id == admin.project_id, Attestation.alias == alias)
    rows = (await db.scalars(query.order_by(Attestation.version))).all()
    data = [
        {
            "version": r.version,
            "sha256": r.sha256,
            "fingerprint": r.fingerprint,
            "measured_on": r.replica,
            "excluded_replicas": st.attestor.status(admin.project_id, alias, r.version),
        }
        for r in rows
    ]
    return {"object": "list", "data": data}
