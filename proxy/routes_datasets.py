"""Admin routes for datasets (storage/datasets.py): create, list, show, diff — the ``onthejob dataset`` commands."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from proxy.deps import AdminDep, DbDep, PathId
from proxy.errors import ApiError, Conflict, InvalidRequest, NotFound
from storage import datasets
from storage.mining import MODES
from storage.models import NO_NUL

router = APIRouter(prefix="/v1/admin", tags=["admin"])


Mode = Literal[MODES]  # type: ignore[valid-type]  # storage.mining.MODES, the failure modes of onthejob mine
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]


class FilterIn(BaseModel):
    """storage.datasets.DatasetFilter: every condition given must hold (a list: any of its entries)."""

    model_config = ConfigDict(extra="forbid")
    alias: Name | None = None
    tags: list[Name] = Field(default_factory=list, max_length=100, description="every one of these tags")
    since: datetime | None = Field(None, description="the trajectory's last call at or after (no zone: UTC)")
    until: datetime | None = Field(None, description="... and before")
    min_reward: float | None = Field(None, allow_inf_nan=False, description="a reward range leaves ungraded out")
    max_reward: float | None = Field(None, allow_inf_nan=False)
    flags: list[Mode] = Field(default_factory=list, description="a call flagged by onthejob mine with one of these")
    feedback: list[Name] = Field(default_factory=list, max_length=100, description="a feedback item with such a name")
    judge: Literal["agrees", "disagrees"] | None = Field(None, description="the judge's grade against another one")


class DatasetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    description: str = Field("", max_length=10_000, pattern=NO_NUL)
    filter: FilterIn = Field(default_factory=lambda: FilterIn.model_validate({}))
    from_mine: Mode | None = Field(None, description="trajectories onthejob mine flagged with this mode")
    curated: bool = Field(False, description="failures with the best successes of the same task")
    per_task: int = Field(2, ge=0, le=1000, description="curated: successes kept per failing task")


def _api_error(exc: datasets.DatasetError) -> ApiError:
    """The storage error as the one envelope: 409 a taken name, 404 an unknown one, else 400."""
    if isinstance(exc, datasets.DatasetExists):
        return Conflict(str(exc), param="name")
    if isinstance(exc, datasets.DatasetNotFound):
        return NotFound(str(exc), param="name")
    return InvalidRequest(str(exc), param="filter")


@router.post("/datasets", status_code=201)
async def create_dataset(item: DatasetIn, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """Select trajectories and pin them (calls, feedback, rewards) under a name never reused."""
    try:
        given = datasets.DatasetFilter.from_dict(item.filter.model_dump(exclude_defaults=True))
        spec = datasets.Spec(given, from_mine=item.from_mine, curated=item.curated, per_task=item.per_task)
        out = await db.run_sync(lambda s: datasets.create(s, admin.project_id, item.name, spec, item.description))
    except datasets.DatasetError as exc:
        raise _api_error(exc) from exc
    await db.commit()
    return out


@router.get("/datasets")
async def list_datasets(admin: AdminDep, db: DbDep) -> dict[str, Any]:
    return {"object": "list", "data": await db.run_sync(lambda s: datasets.list_datasets(s, admin.project_id))}


@router.get("/datasets/{name}")
async def show_dataset(name: PathId, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """The dataset and its items (a deleted session's are gone)."""
    try:
        return await db.run_sync(lambda s: datasets.show(s, admin.project_id, name))
    except datasets.DatasetError as exc:
        raise _api_error(exc) from exc


@router.get("/datasets/{name}/diff/{other}")
async def diff_datasets(name: PathId, other: PathId, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """Items only in ``name``, only in ``other``, and in both with another path, reward or feedback."""
    try:
        return await db.run_sync(lambda s: datasets.diff(s, admin.project_id, name, other))
    except datasets.DatasetError as exc:
        raise _api_error(exc) from exc
