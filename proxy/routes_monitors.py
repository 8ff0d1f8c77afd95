"""Admin routes for monitors and alerts (admin keys only, scoped to the admin's project).

``GET /v1/admin/alerts`` lists alerts (open ones unless ``status=all``), ``POST
/v1/admin/alerts/{id}/resolve`` closes one. ``GET/PUT /v1/admin/aliases/{alias}/monitors``
show and set an alias's monitor overrides (the GET also computes the windows now, raising
nothing); ``GET/PUT /v1/admin/monitors`` the project's tool error patterns. The monitors
themselves run in ``onthejob monitor`` (docs/monitors.md).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from proxy.deps import AdminDep, DbDep, PathId, QueryId
from proxy.errors import InvalidRequest, NotFound
from storage import admin as admin_store
from storage.alerts import alert_to_dict, list_alerts, resolve_alert
from storage.monitor_store import config_for, monitor_settings, run_monitors
from storage.monitors import MONITORS, MonitorConfigError, parse_config

router = APIRouter(prefix="/v1/admin", tags=["monitors"])


@router.get("/alerts")
async def get_alerts(
    admin: AdminDep,
    db: DbDep,
    alias: QueryId = None,
    status: Annotated[Literal["open", "all"], Query(description="open (default) or all")] = "open",
) -> dict[str, Any]:
    """The project's alerts, newest first: monitors' breaches and attestation failures."""
    rows = await list_alerts(db, admin.project_id, alias=alias, include_resolved=status == "all")
    return {"object": "list", "data": [alert_to_dict(a) for a in rows]}


@router.post("/alerts/{alert_id}/resolve")
async def resolve(alert_id: Annotated[int, Path(ge=1, le=2**31 - 1)], admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """Close an alert (a person decided the moved window is fine, or the version is gone); idempotent."""
    row = await resolve_alert(db, admin.project_id, alert_id, by=admin.key_id or "admin")
    if row is None:
        raise NotFound(f"no alert {alert_id} in this project", param="alert_id")
    await db.commit()
    return alert_to_dict(row)


class ThresholdIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["relative", "absolute", "sd"] | None = None
    size: float | None = Field(None, ge=0, allow_inf_nan=False)
    direction: Literal["up", "down", "both"] | None = None
    z: float | None = Field(None, ge=0, allow_inf_nan=False)


class ThresholdsIn(BaseModel):
    """One optional field per monitor, so the schema names exactly what can be set."""

    model_config = ConfigDict(extra="forbid")
    completion_tokens: ThresholdIn | None = None
    answer_tokens: ThresholdIn | None = None
    calls_per_session: ThresholdIn | None = None
    tool_calls_per_session: ThresholdIn | None = None
    tool_error_rate: ThresholdIn | None = None
    timeout_rate: ThresholdIn | None = None
    ungraded_share: ThresholdIn | None = None
    reward: ThresholdIn | None = None
    judge_score: ThresholdIn | None = None
    kl_base: ThresholdIn | None = None


if set(ThresholdsIn.model_fields) != set(MONITORS):  # a new monitor must be settable here too
    raise RuntimeError("ThresholdsIn is out of step with storage.monitors.MONITORS")


class MonitorsIn(BaseModel):
    """An alias's overrides of the documented defaults; fields left out keep the defaults."""

    model_config = ConfigDict(extra="forbid")
    thresholds: ThresholdsIn | None = Field(None, description="per monitor, the fields to change")
    window_sessions: int | None = Field(None, ge=2, le=100_000)
    min_sessions: int | None = Field(None, ge=2, le=100_000)
    settle_s: float | None = Field(None, ge=0, le=30 * 86400, allow_inf_nan=False)
    reference_version: Annotated[int, Field(ge=1, le=2**31 - 1)] | Literal["base"] | None = Field(
        None, description="the version every later one is compared with beside its predecessor; null: the oldest"
    )


async def _known(db: DbDep, project_id: str, alias: str) -> None:
    if alias not in {a.name for a in await admin_store.list_aliases(db, project_id)}:
        raise NotFound(f"no alias {alias!r} in this project: list them at GET /v1/admin/aliases", param="alias")


@router.get("/aliases/{alias}/monitors")
async def get_monitors(alias: PathId, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """The alias's monitor settings (defaults with its overrides) and its windows right now."""
    await _known(db, admin.project_id, alias)
    settings = await admin_store.project_settings(db, admin.project_id)
    override = (monitor_settings(settings).get("aliases") or {}).get(alias) or {}
    config = config_for(settings, alias)
    report = await run_monitors(db, admin.project_id, alias, raise_alerts=False)
    return {"alias": alias, "override": override, "config": config.to_dict(), **report.to_dict()}


@router.put("/aliases/{alias}/monitors")
async def set_monitors(alias: PathId, item: MonitorsIn, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """Replace the alias's overrides (an empty body returns it to the defaults)."""
    await _known(db, admin.project_id, alias)
    override: dict[str, Any] = item.model_dump(exclude_none=True)
    override["thresholds"] = {k: v for k, v in (override.get("thresholds") or {}).items() if v}
    if not override["thresholds"]:
        del override["thresholds"]
    try:
        config = parse_config(override)
    except MonitorConfigError as exc:
        raise InvalidRequest(str(exc), param=str(exc).split(":")[0]) from None
    settings = await admin_store.project_settings(db, admin.project_id)
    mon = monitor_settings(settings)
    mon["aliases"] = {**(mon.get("aliases") or {}), alias: override}
    await admin_store.set_project_setting(db, admin.project_id, "monitors", mon)
    await db.commit()
    return {"alias": alias, "override": override, "config": config.to_dict()}


class ProjectMonitorsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_error_patterns: list[Annotated[str, Field(json_schema_extra={"format": "regex"})]] | None = Field(
        None, max_length=50, description="regexes (Python syntax); a tool result matching one is an error"
    )


@router.get("/monitors")
async def get_project_monitors(admin: AdminDep, db: DbDep) -> dict[str, Any]:
    mon = monitor_settings(await admin_store.project_settings(db, admin.project_id))
    return {"tool_error_patterns": list(config_for({"monitors": mon}, "").tool_error_patterns), **mon}


@router.put("/monitors")
async def set_project_monitors(item: ProjectMonitorsIn, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """The project's tool error patterns (null: the defaults)."""
    for i, pattern in enumerate(item.tool_error_patterns or ()):
        try:
            re.compile(pattern)
        except re.error as exc:
            message = f"tool_error_patterns[{i}] is not a valid regex: {exc}"
            raise InvalidRequest(message, param="tool_error_patterns") from None
    mon = monitor_settings(await admin_store.project_settings(db, admin.project_id))
    if item.tool_error_patterns is None:
        mon.pop("tool_error_patterns", None)
    else:
        mon["tool_error_patterns"] = item.tool_error_patterns
    await admin_store.set_project_setting(db, admin.project_id, "monitors", mon)
    await db.commit()
    return {"tool_error_patterns": list(config_for({"monitors": mon}, "").tool_error_patterns), **mon}
