"""The dashboard's read-only JSON about promotion, datasets and lineage, for any key of the project.

Changing things stays with the admin routes (PUT a policy, POST an eval or a dataset); these
answer what the Learning, Control, Datasets and lineage views show, so a harness key sees its
project's decisions and datasets without being able to alter them.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from proxy.deps import DbDep, PathId, PrincipalDep, QueryId, StateDep
from proxy.errors import NotFound
from proxy.routes_admin import lineage_or_404
from storage import dashboard_promotion as board
from storage import datasets

router = APIRouter(prefix="/v1/ui", tags=["ui"])


@router.get("/promotions")
async def promotions(principal: PrincipalDep, db: DbDep, st: StateDep, alias: QueryId = None) -> dict[str, Any]:
    """Each alias's promotion policy, decisions (oldest first), evals per version and attested versions.

    An attested version says on how many replicas it is out of rotation (a fingerprint mismatch),
    not which: replica URLs are the operator's (GET /v1/admin/aliases/{alias}/attestations).
    """
    project = principal.project_id
    data = await db.run_sync(lambda s: board.promotions(s, project, alias))
    for row in data:
        for att in row["attestations"]:
            att["excluded_replicas"] = len(st.attestor.status(project, row["alias"], att["version"]))
    return {"object": "list", "data": data}


@router.get("/datasets")
async def dataset_list(principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """Every dataset of the project, with the adapter versions trained from it."""
    return {"object": "list", "data": await db.run_sync(lambda s: board.dataset_list(s, principal.project_id))}


@router.get("/datasets/{name}")
async def dataset(
    name: PathId,
    principal: PrincipalDep,
    db: DbDep,
    offset: Annotated[int, Query(ge=0, le=10**7)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """One dataset: its items (path, pinned feedback and reward) from ``offset``, and what trained from it."""
    try:
        return await db.run_sync(lambda s: board.dataset_page(s, principal.project_id, name, offset, limit))
    except datasets.DatasetNotFound as exc:
        raise NotFound(str(exc), param="name") from None


@router.get("/aliases/{alias}/versions/{version}/lineage")
async def version_lineage(alias: PathId, version: PathId, principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """What trained a version: its parent chain, run, datasets, trajectories and feedback items."""
    return await lineage_or_404(db, principal.project_id, alias, version)
