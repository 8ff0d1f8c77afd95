"""The Gemini routes: ``:generateContent`` and ``:streamGenerateContent`` (documented here, served by the
fast path, proxy/app.py) and ``:countTokens``, under ``/v1/models/`` and ``/v1beta/models/`` (and ``/s/{id}/``).

``:countTokens`` is not a call: it renders the request exactly as a call would (the same
translation to chat messages and tools) through the engine's tokenizer, so the count is the
``promptTokenCount`` the call will report. Nothing is recorded: no tokens were sampled.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
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
        router.add_api_route(
            f"{version}{{model}}:{method}",
            endpoint,
            methods=["POST"],
            openapi_extra=SSE_DOC if streams else DOC,
            responses=STREAMED if streams else ERRORS,
            tags=["gemini"],
            include_in_schema=version == VERSIONS[0],
        )
        router.add_api_route(
            f"/s/{{session_id}}{version}{{model}}:{method}", endpoint, methods=["POST"], include_in_schema=False
        )
    router.add_api_route(
        f"{version}{{model}}:countTokens",
        count_tokens,
        methods=["POST"],
        openapi_extra=DOC,
        responses=ERRORS,
        tags=["gemini"],
        include_in_schema=version == VERSIONS[0],
    )
    router.add_api_route(
        f"/s/{{session_id}}{version}{{model}}:countTokens",
        session_count_tokens,
        methods=["POST"],
        include_in_schema=False,
    )


# models.list and models.get, as the google-genai SDK calls them: ``GET /v1beta/models`` and
# ``.../models/{model}``, and under ``/v1/`` (the SDK's default version). ``GET /v1/models`` is OpenAI's
# too: a client that authenticates the Google way (``x-goog-api-key`` or ``?key=``, no Bearer and no
# ``x-api-key``) gets Google's answer there (proxy/routes_openai.py asks :func:`google_client`).
METHODS_SERVED = ["generateContent", "streamGenerateContent", "countTokens"]
MAX_PAGE = 1000  # Google's own cap on pageSize
PageSize = Annotated[int, Query(alias="pageSize", ge=0, le=MAX_PAGE)]
PageToken = Annotated[str | None, Query(alias="pageToken", max_length=20, pattern=r"^[0-9]*$")]


def google_client(request: Request) -> bool:
    """Whether a request authenticates as Google's SDK does (so it expects Google's shapes)."""
    headers = request.headers
    if "authorization" in headers or "x-api-key" in headers:
        return False
    return "x-goog-api-key" in headers or "key" in request.query_params


def model_view(alias: str) -> dict[str, Any]:
    """A ``Model`` as the Gemini API describes one: an alias this key may call, by the methods served here."""
    return {
        "name": f"models/{alias}",
        "baseModelId": alias,
        "version": "1",
        "displayName": alias,
        "description": "an onthejob alias",
        "supportedGenerationMethods": METHODS_SERVED,
    }


async def _principal(request: Request) -> Any:
    """The caller, by its key the way Google's SDK sends it (or Bearer, or ``x-api-key``)."""
    st: Any = request.app.state.onthejob
    headers = {k.lower(): v for k, v in request.headers.items()}
    credentials = GeminiDialect(key=request.query_params.get("key")).credentials(headers)
    client = request.client.host if request.client else None
    return await st.auth.admit(credentials, headers.get("x-api-key"), client)


async def _visible(request: Request) -> list[str]:
    visible: list[str] = request.app.state.onthejob.router.visible((await _principal(request)).project_id)
    return visible


def _google_error(exc: ApiError) -> Response:
    return ORJSONResponse(error_body(exc), status_code=error_status(exc), headers=exc.headers)


async def models_page(request: Request, page_size: int = 50, page_token: str | None = None) -> Response:
    """``models.list``: the aliases this key may use, as Gemini ``Model``s; ``pageToken`` is the next offset.
    Errors in Google's shape, whatever the path."""
    try:
        names = await _visible(request)
    except ApiError as exc:
        return _google_error(exc)
    start, size = int(page_token or 0), page_size or 50
    out: dict[str, Any] = {"models": [model_view(n) for n in names[start : start + size]]}
    if start + size < len(names):
        out["nextPageToken"] = str(start + size)
    return ORJSONResponse(out)


async def model_answer(request: Request, model: str) -> Response:
    """``models.get``: one alias this key may use, as a Gemini ``Model``; 404 in Google's shape otherwise."""
    try:
        if ":" in model:  # a method of a model (``:generateContent``): served as POST only
            wrong = ApiError(f"GET {request.url.path} is not served: {model.partition(':')[2]} takes POST")
            wrong.status, wrong.type = 405, "invalid_request_error"
            raise wrong
        if model.removeprefix("models/") not in await _visible(request):
            raise NotFound(
                f"model {model!r} is not an alias this key may use (GET /v1beta/models lists them)",
                param="model",
                code="model_not_found",
            )
    except ApiError as exc:
        return _google_error(exc)
    return ORJSONResponse(model_view(model.removeprefix("models/")))


@router.get("/v1beta/models", responses=ERRORS, tags=["gemini"])
@router.get("/s/{session_id}/v1beta/models", include_in_schema=False)
async def list_models(request: Request, page_size: PageSize = 50, page_token: PageToken = None) -> Response:
    """The aliases this key may use, as Gemini ``Model``s (``models.list``; also ``GET /v1/models`` with a
    Google key)."""
    return await models_page(request, page_size, page_token)


@router.get("/v1beta/models/{model}", responses=ERRORS, tags=["gemini"])
@router.get("/s/{session_id}/v1beta/models/{model}", include_in_schema=False)
async def get_model(request: Request, model: str) -> Response:
    """One alias this key may use, as a Gemini ``Model`` (``models.get``; also ``GET /v1/models/{model}``
    with a Google key)."""
    return await model_answer(request, model)


async def _count(request: Request, model: str) -> int:
    st: Any = request.app.state.onthejob
    principal = await _principal(request)
    payload = count_tokens_body(await read_json(request, st.settings.max_body_bytes), model)
    payload["model"] = st.router.resolve(principal.project_id, model).served_model
    return await engine_token_count(st, payload)


@router.post("/v1beta/models/{model}", include_in_schema=False)
@router.post("/v1/models/{model}", include_in_schema=False)
async def unserved_method(model: str) -> Response:
    """A model method not served here (``:embedContent``, ``:batchGenerateContent``...): 404 in Google's shape
    naming the ones that are (after the served methods' own routes, above)."""
    if ":" not in model:  # not a model method: the path's own API answers (proxy/routes_openai.dialect_of)
        raise NotFound(f"POST {model!r}: no such route")
    method = model.partition(":")[2]
    served = ", ".join(METHODS_SERVED)
    return _google_error(NotFound(f"the model method {method!r} is not served here; served: {served}"))
