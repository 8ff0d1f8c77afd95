"""The Anthropic routes: ``POST /v1/messages`` (documented here, served by the fast path) and count_tokens.

``/v1/messages`` is a dialect served by the one call path (:mod:`proxy.dialects`).
``POST /v1/messages/count_tokens`` is not a call: it renders the request exactly as a
call would (the same translation to chat messages and tools) through the engine's
tokenizer, so the count is the ``input_tokens`` the call will report. Nothing is recorded: no tokens were sampled.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.deps import PathId
from proxy.dialects import ROUTES
from proxy.dialects.anthropic import count_tokens_body
from proxy.dialects.anthropic_out import error_body, error_status
from proxy.dialects.anthropic_schema import COUNT_SCHEMA, MESSAGES_SCHEMA
from proxy.errors import ApiError
from proxy.handle import engine_token_count, handle
from proxy.request_body import read_json
from proxy.responses import ORJSONResponse

router = APIRouter()
ANTHROPIC = ROUTES["/v1/messages"]  # the registered instance (stateless)
MESSAGES_DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": MESSAGES_SCHEMA}}}}
COUNT_DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": COUNT_SCHEMA}}}}


# Requests for these two are served by proxy.app.ProxyApp before FastAPI; they document the routes.
@router.post("/v1/messages", openapi_extra=MESSAGES_DOC, tags=["anthropic"])
async def create_message(request: Request) -> Any:
    """The Anthropic Messages API, streaming or not, recorded token-exactly as a chat call."""
    return await handle(request, "chat", dialect=ANTHROPIC)


@router.post("/s/{session_id}/v1/messages", openapi_extra=MESSAGES_DOC, tags=["anthropic"])
async def session_create_message(request: Request, session_id: PathId) -> Any:
    return await handle(request, "chat", path_session=session_id, dialect=ANTHROPIC)


@router.post("/v1/messages/count_tokens", openapi_extra=COUNT_DOC, tags=["anthropic"])
async def count_tokens(request: Request) -> Response:
    """The prompt's token count for a Messages request, in Anthropic's shape (``{"input_tokens": N}``)."""
    try:
        return ORJSONResponse({"input_tokens": await _count(request)})
    except ApiError as exc:
        return ORJSONResponse(error_body(exc), status_code=error_status(exc), headers=exc.headers)


@router.post("/s/{session_id}/v1/messages/count_tokens", include_in_schema=False)
async def session_count_tokens(request: Request, session_id: PathId) -> Response:
    return await count_tokens(request)


async def _count(request: Request) -> int:
    st: Any = request.app.state.onthejob
    headers = request.headers
    client = request.client.host if request.client else None
    principal = await st.auth.admit(headers.get("authorization"), headers.get("x-api-key"), client)
    payload = count_tokens_body(await read_json(request, st.settings.max_body_bytes))
    payload["model"] = st.router.resolve(principal.project_id, payload["model"]).served_model
    return await engine_token_count(st, payload)
