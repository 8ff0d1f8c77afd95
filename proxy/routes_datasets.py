"""Admin routes for datasets (storage/datasets.py): create, list, show, diff — the ``onthejob dataset`` commands.

Each runs in the worker's dataset process (storage/dataset_jobs.py, :func:`_off_loop`): making a dataset
assembles every candidate session (10,000 of them take seconds of CPU), and a show or a diff builds every
item; on the event loop, or in a thread sharing its GIL, that stalls every call in flight
(``python -m bench.serving_under_load``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from proxy.admission import MAX_TAGS, TAG_CHARS
from proxy.deps import AdminDep, PathId, app_state
from proxy.errors import ApiError, Conflict, InvalidRequest, NotFound, Unavailable
from storage import datasets
from storage.dataset_jobs import DatasetWorker, WorkerGone
from storage.mining import MODES
from storage.models import NO_NUL

router = APIRouter(prefix="/v1/admin", tags=["admin"])


Mode = Literal[MODES]  # type: ignore[valid-type]  # storage.mining.MODES, the failure modes of onthejob mine
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]
Tag = Annotated[str, Field(min_length=1, max_length=TAG_CHARS, pattern=NO_NUL)]  # as a call may record one


class FilterIn(BaseModel):
    """storage.datasets.DatasetFilter: every condition given must hold (a list: any of its entries)."""

    model_config = ConfigDict(extra="forbid")
    alias: Name | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS, description="every one of these tags")
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


def dataset_worker(request: Request) -> DatasetWorker:
    """The app's dataset process (proxy/state.py, storage/dataset_jobs.py)."""
    return app_state(request).datasets


WorkerDep = Annotated[DatasetWorker, Depends(dataset_worker)]


async def _off_loop(worker: DatasetWorker, job: str, *args: Any) -> Any:
    """``job`` in the dataset process; a storage error as the envelope's."""
    try:
        return await worker.run(job, *args)
    except datasets.DatasetError as exc:
        raise _api_error(exc) from exc
    except WorkerGone as exc:
        raise Unavailable(str(exc)) from exc


@router.post("/datasets", status_code=201)
async def create_dataset(item: DatasetIn, admin: AdminDep, worker: WorkerDep) -> dict[str, Any]:
    """Select trajectories and pin them (calls, feedback, rewards) under a name never reused."""
    try:
        given = datasets.DatasetFilter.from_dict(item.filter.model_dump(exclude_defaults=True))
        spec = datasets.Spec(given, from_mine=item.from_mine, curated=item.curated, per_task=item.per_task)
    except datasets.DatasetError as exc:
        raise _api_error(exc) from exc
    return await _off_loop(worker, "create", admin.project_id, item.name, spec, item.description)  # type: ignore[no-any-return]


@router.get("/datasets")
async def list_datasets(admin: AdminDep, worker: WorkerDep) -> dict[str, Any]:
    return {"object": "list", "data": await _off_loop(worker, "list", admin.project_id)}


@router.get("/datasets/{name}")
async def show_dataset(name: PathId, admin: AdminDep, worker: WorkerDep) -> dict[str, Any]:
    """The dataset and its items (a deleted session's are gone)."""
    return await _off_loop(worker, "show", admin.project_id, name)  # type: ignore[no-any-return]


@router.get("/datasets/{name}/diff/{other}")
async def diff_datasets(name: PathId, other: PathId, admin: AdminDep, worker: WorkerDep) -> dict[str, Any]:
    """Items only in ``name``, only in ``other``, and in both with another path, reward or feedback."""
    return await _off_loop(worker, "diff", admin.project_id, name, other)  # type: ignore[no-any-return]
