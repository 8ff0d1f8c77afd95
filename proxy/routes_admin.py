"""Admin routes (admin keys only): keys, aliases, adapters, deployments — all scoped to the admin's project."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncSession

from proxy.deps import AdminDep, DbDep, PathId, QueryId, StateDep
from proxy.errors import Conflict, InvalidRequest, NotFound
from storage import admin as admin_store
from storage import deletion, lineage
from storage.grading import RewardRule
from storage.judge_config import JudgeSettingsError, parse_judge_settings
from storage.judge_store import judge_state_async
from storage.keys import create_key
from storage.mining import MineConfig
from storage.models import NO_NUL, ApiKey
from storage.records import end_user_key

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["harness", "admin"] = Field("harness", description="harness (call and give feedback) or admin")
    name: str = Field("", max_length=200, pattern=NO_NUL)


class AliasIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    base_model: str = Field(min_length=1, max_length=200, pattern=NO_NUL)


class DeploymentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alias: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="adapter version; null rolls back to base")
    candidate: bool = Field(
        False,
        description="true (the trainer): the alias's promotion policy decides; false: route it now (manual). "
        "Back to base (version null) is always manual.",
    )


def _key_view(k: ApiKey) -> dict[str, Any]:
    return {
        "id": k.id,
        "project": k.project_id,
        "role": k.role,
        "name": k.name,
        "prefix": k.prefix,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
    }


@router.post("/keys", status_code=201)
async def create_api_key(item: KeyIn, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """Create a key in the admin's project; the secret is in this answer only."""
    key = await db.run_sync(lambda s: create_key(s, admin.project_id, item.role, item.name))
    await db.commit()
    return {"id": key.id, "project": key.project_id, "role": key.role, "key": key.secret}


@router.get("/keys")
async def list_keys(admin: AdminDep, db: DbDep) -> dict[str, Any]:
    return {"object": "list", "data": [_key_view(k) for k in await admin_store.list_keys(db, admin.project_id)]}


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: PathId, admin: AdminDep, db: DbDep, st: StateDep) -> dict[str, Any]:
    row = await admin_store.revoke_key(db, admin.project_id, key_id)
    if row is None:
        raise NotFound(f"no key {key_id!r} in this project", param="key_id")
    await db.commit()
    st.auth.forget()
    return _key_view(row)


@router.delete("/sessions/{session_id}")
async def delete_session(session_id: PathId, admin: AdminDep, db: DbDep, request: Request) -> dict[str, Any]:
    """Remove a session's calls, feedback and flags (its spooled copies never land); name who learned from it.

    Calls of that id made afterwards start it afresh. Every worker learns of it from the change log; this one now.
    """
    out = await db.run_sync(lambda s: deletion.delete_session(s, admin.project_id, session_id))
    await db.commit()
    _forget(request, admin.project_id, [session_id])
    return out


@router.delete("/end-users/{end_user}")
async def delete_end_user(
    end_user: Annotated[str, Path(min_length=1, max_length=4096, pattern=NO_NUL)],
    admin: AdminDep,
    db: DbDep,
    request: Request,
) -> dict[str, Any]:
    """Delete every session of an end user (``user``, ``metadata.user_id``/``end_user`` of their calls) as above.

    Their calls still in a spool never land either (those made afterwards do); the answer names the sessions and
    who learned from them.
    """
    out = await db.run_sync(lambda s: deletion.delete_end_user(s, admin.project_id, end_user))
    await db.commit()
    _forget(request, admin.project_id, out["sessions"], [end_user_key(end_user)])
    return out


def _forget(request: Request, project: str, sessions: list[str], end_users: list[str] | None = None) -> None:
    """This worker's link cache forgets a delete at once (the others read it from the change log)."""
    st = getattr(request.app.state, "onthejob", None)  # None: routes mounted without the proxy (tests)
    if st is not None:
        st.linker.deletes.forget(project, sessions, end_users or [])


@router.get("/aliases/{alias}/versions/{version}/lineage")
async def version_lineage(alias: PathId, version: PathId, admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """What trained this version: its parent chain, and the trajectories and feedback items of its step."""
    return await lineage_or_404(db, admin.project_id, alias, version)


async def lineage_or_404(db: AsyncSession, project_id: str, alias: str, version: str) -> dict[str, Any]:
    """``version``'s lineage (a path segment: digits), or 404 (also served read-only to the dashboard)."""
    number = int(version) if version.isdigit() and len(version) < 10 else None
    out = None
    if number is not None:
        out = await db.run_sync(lambda s: lineage.version_lineage(s, project_id, alias, number))
    if out is None:
        raise NotFound(f"no version {version} of alias {alias!r} in this project", param="version")
    return out


@router.get("/lineage")
async def learned_from(
    admin: AdminDep, db: DbDep, session_id: QueryId = None, completion_id: QueryId = None, feedback_id: QueryId = None
) -> dict[str, Any]:
    """Which adapter versions learned from a session, a call or a feedback item (transitively, through parents).

    With none of the three, nothing is asked about: an empty list.
    """

    def find(s: Any) -> list[dict[str, Any]]:
        calls = lineage.session_calls(s, admin.project_id, session_id) if session_id is not None else []
        calls += [completion_id] if completion_id is not None else []
        return lineage.learned_from(s, admin.project_id, calls=calls, feedback=[feedback_id] if feedback_id else [])

    return {"object": "list", "data": await db.run_sync(find)}


@router.get("/aliases")
async def list_aliases(admin: AdminDep, db: DbDep) -> dict[str, Any]:
    rows = await admin_store.list_aliases(db, admin.project_id)
    return {
        "object": "list",
        "data": [{"name": a.name, "base_model": a.base_model, "deployed_version": a.deployed_version} for a in rows],
    }


@router.post("/aliases", status_code=201)
async def create_alias(item: AliasIn, admin: AdminDep, db: DbDep, st: StateDep) -> dict[str, Any]:
    """A public name for a base model; deployments later point it at adapter versions."""
    if st.router.base_models and item.base_model not in st.router.base_models:
        raise NotFound(
            f"'base_model' must be one the engines serve: {sorted(st.router.base_models)}", param="base_model"
        )
    if not await admin_store.add_alias(db, admin.project_id, item.name, item.base_model):
        raise Conflict(f"alias {item.name!r} exists already", param="name", code="alias_exists")
    await db.commit()
    await st.router.refresh()
    return {"name": item.name, "base_model": item.base_model, "deployed_version": None}


@router.get("/adapters")
async def list_adapters(admin: AdminDep, db: DbDep, alias: QueryId = None) -> dict[str, Any]:
    rows = await admin_store.list_adapters(db, admin.project_id, alias)
    return {
        "object": "list",
        "data": [
            {
                "alias": a.alias,
                "version": a.version,
                "parent_version": a.parent_version,
                "path": a.path,
                "sha256": a.sha256,
                "base_model": a.base_model,
                "training_run_id": a.training_run_id,
                "metrics": a.metrics,
                "created_at": a.created_at,
            }
            for a in rows
        ],
    }


@router.get("/deployments")
async def list_deployments(admin: AdminDep, db: DbDep, alias: QueryId = None) -> dict[str, Any]:
    rows = await admin_store.list_deployments(db, admin.project_id, alias)
    return {
        "object": "list",
        "data": [
            {
                "id": d.id,
                "alias": d.alias,
                "version": d.version,
                "previous_version": d.previous_version,
                "status": d.status,
                "detail": d.detail,
                "created_at": d.created_at,
            }
            for d in rows
        ],
    }


@router.post("/deployments", status_code=201)
async def deploy(item: DeploymentIn, admin: AdminDep, st: StateDep) -> dict[str, Any]:
    """Load ``alias@vN`` into every engine replica, verify, then route the alias to it (null: back to base).

    With ``candidate: true`` the alias's promotion policy decides instead (gate, canary: not routed yet).
    """
    if item.candidate and item.version is not None:
        return await st.promotion.submit(admin.project_id, item.alias, item.version)
    result = await st.router.deploy(admin.project_id, item.alias, item.version)
    await st.promotion.manual(admin.project_id, item.alias, item.version, result)
    return result


class RedactIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    store_text: bool = Field(True, description="false: store no message text at all (token ids stay)")
    patterns: list[Annotated[str, Field(json_schema_extra={"format": "regex"})]] = Field(
        default_factory=list, max_length=50, description="regexes (Python syntax) replaced by [redacted]"
    )


class ProjectIn(BaseModel):
    """Per-project policy; each given field replaces that setting, the others stay."""

    # An empty body changes nothing and is refused: the schema says so too (schemathesis holds us to it).
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    redact: RedactIn | None = None
    judge: dict[str, Any] | None = Field(
        default=None, description="the project's judge: rubric, mode, endpoint, gate (docs/learning.md); null: none"
    )
    reward: dict[str, Any] | None = Field(
        default=None, description='the reward rule, e.g. {"numeric": ["score"]}; null: the default rule'
    )
    implicit_feedback: bool | None = Field(
        default=None, description="read the user's next message as feedback on the answer before it"
    )
    implicit_feedback_skip: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None,
        max_length=20,
        description="user messages starting with one of these are a tool's output in the harness's text protocol"
        ' (e.g. "RESULT:"), never feedback',
    )
    mine: dict[str, Any] | None = Field(
        default=None, description="what `onthejob mine` counts as a failure: patterns, text protocol, thresholds"
    )
    retention_days: int | None = Field(
        default=None, ge=1, le=36500, description="delete raw calls and their feedback after this many days; null: keep"
    )


REWARD_KEYS = ("name", "numeric", "booleans", "labels", "priority", "failure", "proxy_failures", "proxy_masked")


def _checked(item: ProjectIn) -> dict[str, Any]:
    """The settings to write, each validated; errors name the field."""
    given = {name: getattr(item, name) for name in item.model_fields_set}
    if not given:
        raise InvalidRequest(f"give at least one of {', '.join(ProjectIn.model_fields)}", param="settings")
    if item.redact is not None:
        for i, pattern in enumerate(item.redact.patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise InvalidRequest(
                    f"redact.patterns[{i}] is not a valid regex: {exc}", param="redact.patterns"
                ) from exc
        given["redact"] = item.redact.model_dump()
    if item.judge is not None:
        try:
            given["judge"] = parse_judge_settings(item.judge).model_dump(mode="json", exclude_unset=True)  # type: ignore[union-attr]
        except JudgeSettingsError as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
    if item.reward is not None:
        unknown = sorted(set(item.reward) - set(REWARD_KEYS))
        if unknown:
            raise InvalidRequest(f"reward.{unknown[0]} is not a setting; use {', '.join(REWARD_KEYS)}", param="reward")
        try:
            RewardRule.from_config(item.reward)
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidRequest(f"reward: {exc}", param="reward") from None
    if item.mine is not None:
        try:
            MineConfig.from_settings({"mine": item.mine})
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(str(exc), param="mine") from None
    return given


@router.get("/project")
async def get_project(admin: AdminDep, db: DbDep) -> dict[str, Any]:
    return {"id": admin.project_id, "settings": await admin_store.project_settings(db, admin.project_id)}


@router.put("/project")
async def set_project(item: ProjectIn, admin: AdminDep, db: DbDep, st: StateDep) -> dict[str, Any]:
    """Project policy (redaction, judge, reward, implicit feedback, mining, retention); replicas follow within 1 s."""
    settings: dict[str, Any] = {}
    for key, value in _checked(item).items():
        settings = await admin_store.set_project_setting(db, admin.project_id, key, value)
    await db.commit()
    await st.refresh()
    return {"id": admin.project_id, "settings": settings}


@router.get("/judge")
async def get_judge(admin: AdminDep, db: DbDep) -> dict[str, Any]:
    """The project's judge: its configuration's fingerprint, newest calibration, and whether its grades count."""
    return {"id": admin.project_id, **(await judge_state_async(db, admin.project_id)).to_dict()}
