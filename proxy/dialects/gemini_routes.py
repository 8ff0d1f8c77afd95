"""The Gemini routes: ``:generateContent`` and ``:streamGenerateContent`` (documented here, served by the
fast path, proxy/app.py) and ``:countTokens``, under ``/v1/models/`` and ``/v1beta/models/`` (and ``/s/{id}/``).

``:countTokens`` is not a call: it renders the request exactly as a call would (the same
translation to chat messages and tools) through the engine's tokenizer, so the count is the
``promptTokenCount`` the call will report. Nothing is recorded: no tokens were sampled.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from proxy.deps import PathId
from proxy.dialects.gemini import VERSIONS, GeminiDialect, call_route, count_tokens_body
from proxy.dialects.gemini_out import error_body, error_status
from proxy.errors import ApiError, NotFound
from proxy.handle import engine_token_count, handle
from proxy.request_body import read_json
from proxy.responses import ORJSONResponse

router = APIRouter()
# The OpenAPI documentation of a request: its text-only core, typed as checked (function calls and
# responses, tools and toolConfig are accepted too, checked with the field named beyond what a schema says).
TEXT_PART = {
    "type": "object",
    "required": ["text"],
    "additionalProperties": True,
    "properties": {"text": {"type": "string", "minLength": 1}},
}
CONTENT = {
    "type": "object",
    "required": ["parts"],
    "additionalProperties": True,
    "properties": {"role": {"enum": ["user", "model"]}, "parts": {"type": "array", "minItems": 1, "items": TEXT_PART}},
}
GENERATION_CONFIG = {
    "type": "object",
    "additionalProperties": True,
    "properties": {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "topP": {"type": "number", "minimum": 0, "maximum": 1},
        "topK": {"type": "integer", "minimum": 0},
        "maxOutputTokens": {"type": "integer", "minimum": 1},
        "candidateCount": {"enum": [1]},
        "stopSequences": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "seed": {"type": "integer"},
        "responseMimeType": {"enum": ["text/plain", "application/json"]},
    },
}
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "required": ["contents"],
    "properties": {
        "contents": {"type": "array", "minItems": 1, "items": CONTENT},
        "systemInstruction": CONTENT,
        "generationConfig": GENERATION_CONFIG,
    },
}
DOC = {"requestBody": {"required": True, "content": {"application/json": {"schema": REQUEST_SCHEMA}}}}
SSE_DOC = {
    **DOC,
    "parameters": [
        {
            "name": "alt",
            "in": "query",
            "required": True,
            "schema": {"enum": ["sse"]},
            "description": "only server-sent events are served",
        }
    ],
}


class GoogleError(BaseModel):
    code: int
    message: str
    status: str
    details: list[dict[str, Any]] | None = None


class GoogleErrorBody(BaseModel):
    """Google's error envelope, as every Gemini route answers a failure."""

    error: GoogleError


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": GoogleErrorBody, "description": f"{name} (the field named in details)"}
    for status, name in (
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (403, "PERMISSION_DENIED"),
        (404, "NOT_FOUND"),
        (409, "ABORTED"),
        (413, "INVALID_ARGUMENT"),
        (429, "RESOURCE_EXHAUSTED"),
        (499, "CANCELLED"),
        (500, "INTERNAL"),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
    )
}
STREAMED = {
    **ERRORS,
    200: {
        "description": "server-sent events, one GenerateContentResponse each",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}


async def _call(request: Request) -> Any:
    target = call_route(request.url.path, request.scope.get("query_string", b""))
    if target is None:
        raise NotFound(f"no Gemini call route {request.url.path!r}")
    endpoint, session, dialect = target
    return await handle(request, endpoint, path_session=session, dialect=dialect)


async def generate_content(request: Request, model: str) -> Any:
    """The Gemini API's generateContent, recorded token-exactly as a chat call."""
    return await _call(request)


async def stream_generate_content(request: Request, model: str) -> Any:
    """The Gemini API's streamGenerateContent (``?alt=sse``: one event per engine chunk), recorded token-exactly."""
    return await _call(request)


async def count_tokens(request: Request, model: str) -> Response:
    """The prompt's token count for a request, in Google's shape (``{"totalTokens": N}``); nothing is recorded."""
    try:
        total = await _count(request, model)
    except ApiError as exc:
        return ORJSONResponse(error_body(exc), status_code=error_status(exc), headers=exc.headers)
    return ORJSONResponse({"totalTokens": total, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": total}]})


async def session_count_tokens(request: Request, session_id: PathId, model: str) -> Response:
    return await count_tokens(request, model)


# The google-genai SDK calls /v1/models/...; Google's REST reference names /v1beta/models/...: both are served.
# Calls are served by proxy.app.ProxyApp before FastAPI (these routes document them); countTokens is served here.
for version in VERSIONS:
    for method, endpoint in (("generateContent", generate_content), ("streamGenerateContent", stream_generate_content)):
        streams = method == "streamGenerateContent"
        router.add_api_route(f"{version}{{model}}:{method}", endpoint, methods=["POST"],
                             openapi_extra=SSE_DOC if streams else DOC, responses=STREAMED if streams else ERRORS,
                             tags=["gemini"], include_in_schema=version == VERSIONS[0])  # fmt: skip
        router.add_api_route(f"/s/{{session_id}}{version}{{model}}:{method}", endpoint, methods=["POST"],
                             include_in_schema=False)  # fmt: skip
    router.add_api_route(f"{version}{{model}}:countTokens", count_tokens, methods=["POST"], openapi_extra=DOC,
                         responses=ERRORS, tags=["gemini"], include_in_schema=version == VERSIONS[0])  # fmt: skip
    router.add_api_route(f"/s/{{session_id}}{version}{{model}}:countTokens", session_count_tokens, methods=["POST"],
                         include_in_schema=False)  # fmt: skip


async def _count(request: Request, model: str) -> int:
    st: Any = request.app.state.onthejob
    headers = {k.lower(): v for k, v in request.headers.items()}
    dialect = GeminiDialect(model, key=request.query_params.get("key"))
    client = request.client.host if request.client else None
    principal = await st.auth.admit(dialect.credentials(headers), headers.get("x-api-key"), client)
    payload = count_tokens_body(await read_json(request, st.settings.max_body_bytes), model)
    payload["model"] = st.router.resolve(principal.project_id, model).served_model
    return await engine_token_count(st, payload)
