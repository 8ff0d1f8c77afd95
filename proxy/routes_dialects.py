"""The dialect routes: the Responses API's calls (served first by the fast path, documented here) and reads.

``POST /v1/responses`` is translated at the edge into a chat call (proxy/dialects/);
``GET /v1/responses/{id}`` returns a stored response exactly as its client got it, from
the moment its last byte was sent (this worker's memory, a sibling's spool, or the
database), for the caller's project only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from proxy.deps import PathId, PrincipalDep, StateDep
from proxy.dialects import ROUTES
from proxy.dialects.responses import REQUEST_SCHEMA
from proxy.errors import NotFound
from proxy.handle import handle

router = APIRouter()
RESPONSES = ROUTES["/v1/responses"]  # the registered instance (stateless)

RESPONSES_DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": REQUEST_SCHEMA}}}}


# Requests for these two are served by proxy.app.ProxyApp before FastAPI; they document the routes.
@router.post("/v1/responses", openapi_extra=RESPONSES_DOC, tags=["responses"])
async def create_response(request: Request) -> Any:
    """The OpenAI Responses API, streaming or not, recorded token-exactly as a chat call."""
    return await handle(request, "chat", dialect=RESPONSES)


@router.post("/s/{session_id}/v1/responses", openapi_extra=RESPONSES_DOC, tags=["responses"])
async def session_create_response(request: Request, session_id: PathId) -> Any:
    return await handle(request, "chat", path_session=session_id, dialect=RESPONSES)


@router.get("/v1/responses/{response_id}", tags=["responses"])
async def get_response(response_id: PathId, principal: PrincipalDep, st: StateDep) -> dict[str, Any]:
    """A stored response of the caller's project, as its client got it."""
    found = await st.linker.find_call(principal.project_id, response_id)
    if found is None or found.dialect != RESPONSES.name or found.client_response is None:
        raise NotFound(f"no response {response_id!r} (a failed call has none)", param="response_id")
    if (found.client_request or {}).get("store") is False:
        raise NotFound(f"response {response_id!r} was created with store: false", param="response_id")
    return found.client_response
