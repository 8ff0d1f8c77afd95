"""Feedback and session read routes: ``POST/GET /v1/feedback``, ``GET /v1/sessions/{id}[/trajectories]``.

Thin: parse (:mod:`storage.feedback_input`), call :mod:`storage.feedback` / :mod:`storage.loaders`, return.
Everything is scoped to the caller's project; another project's ids look
unknown (feedback pending, reads 404).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from proxy.deps import DbDep, PathId, PrincipalDep, QueryId
from proxy.errors import Conflict, InvalidRequest, NotFound
from proxy.redact import project_settings, redact_feedback
from storage.feedback import submit_feedback
from storage.feedback_input import FeedbackConflict, FeedbackInputError, openapi_schema, parse_feedback
from storage.feedback_read import feedback_to_dict, list_feedback
from storage.loaders import load_trajectories_async, session_view
from storage.trajectories import trajectory_to_dict

router = APIRouter()


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON ({exc}); send a feedback object or a list") from None


FEEDBACK_DOC: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": openapi_schema()}}}
}


@router.post(
    "/v1/feedback",
    status_code=201,
    openapi_extra=FEEDBACK_DOC,
    responses={201: {"description": "stored and attached"}, 202: {"description": "stored, pending its target"}},
)
async def post_feedback(request: Request, principal: PrincipalDep, db: DbDep) -> JSONResponse:
    """Store one item or a batch (text redacted by the project's policy): 201 when every target is known, else 202."""
    body = await _json_body(request)
    try:
        items, batch = parse_feedback(body)
        items = redact_feedback(items, await project_settings(db, principal.project_id))
        rows = await submit_feedback(db, principal.project_id, items)
    except FeedbackConflict as exc:
        raise Conflict(str(exc), param=exc.param, code="idempotency_key_reused") from None
    except FeedbackInputError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    stored = [feedback_to_dict(row) for row in rows]
    await db.commit()
    status = 201 if all(item["status"] == "attached" for item in stored) else 202
    return JSONResponse({"object": "list", "data": stored} if batch else stored[0], status_code=status)


@router.get("/v1/feedback")
async def get_feedback(
    principal: PrincipalDep, db: DbDep, completion_id: QueryId = None, session_id: QueryId = None
) -> dict[str, Any]:
    """History of feedback on a completion and/or a session (else the newest 200), each marked ``current`` or not."""
    data = await list_feedback(db, principal.project_id, completion_id=completion_id, session_id=session_id)
    return {"object": "list", "data": data}


def _not_found(session_id: str) -> NotFound:
    return NotFound(f"no session {session_id!r} in this project", param="session_id", code="session_not_found")


# Registered before the plain session route: session ids may contain "/".
@router.get("/v1/sessions/{session_id:path}/trajectories")
async def get_trajectories(session_id: PathId, principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """The session's trajectories, token-exact, with rewards and how they were derived."""
    trajectories = await load_trajectories_async(db, principal.project_id, session_ids=[session_id])
    if not trajectories:
        raise _not_found(session_id)
    return {"object": "list", "session_id": session_id, "data": [trajectory_to_dict(t) for t in trajectories]}


@router.get("/v1/sessions/{session_id:path}")
async def get_session(session_id: PathId, principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """The session, a summary of each call and its feedback history."""
    view = await session_view(db, principal.project_id, session_id)
    if view is None:
        raise _not_found(session_id)
    return view
