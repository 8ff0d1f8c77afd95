"""OpenAI routes: calls (also under /s/{session_id}/ for harnesses that can only set a base URL),
models, tokenizer passthrough, and stored completions read back the OpenAI way."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy import select
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from proxy.deps import MAX_ID, DbDep, PathId, PrincipalDep, QueryId, StateDep, current_principal
from proxy.dialects import ROUTES as DIALECT_ROUTES
from proxy.dialects.base import Dialect
from proxy.dialects.gemini import GeminiDialect
from proxy.dialects.gemini_routes import PageSize, PageToken, google_client, model_answer, models_page
from proxy.errors import DATABASE_DOWN, ApiError, DatabaseUnavailable, NotFound, UpstreamError
from proxy.handle import handle
from proxy.request_body import read_json
from proxy.responses import ORJSONResponse, error_response
from storage.models import NO_NUL, Completion

router = APIRouter()


def _doc(required: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI request body: the fields we check, everything else passes through to the engine."""
    schema = {"type": "object", "additionalProperties": True, "required": list(required), "properties": required}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


MODEL = {"type": "string", "minLength": 1, "description": "an alias from GET /v1/models"}
CHAT_DOC = _doc({"model": MODEL, "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}}})
_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}}
# One prompt per call (proxy/capture.py check_one_prompt): text, token ids, or a list holding one of those.
COMPLETIONS_DOC = _doc(
    {
        "model": MODEL,
        "prompt": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                _IDS,
                {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [{"type": "string"}, _IDS]}},
            ]
        },
    }
)
TOKENIZER_DOC = _doc({"model": MODEL})


# Every POST route served before FastAPI's layers: (engine endpoint, dialect translating at the edge or None).
CALL_PATHS: dict[str, tuple[str, Dialect | None]] = {
    "/v1/chat/completions": ("chat", None),
    "/v1/completions": ("completions", None),
    **{path: ("chat", dialect) for path, dialect in DIALECT_ROUTES.items()},
}
log = logging.getLogger("onthejob.proxy")


def call_route(path: str) -> tuple[str, str | None, Dialect | None] | None:
    """(endpoint, session named by the path, dialect) for a call route, matched as the routes below would be."""
    target = CALL_PATHS.get(path)
    if target is not None:
        return target[0], None, target[1]
    if path.startswith("/s/"):
        session, _, rest = path[3:].partition("/")
        target = CALL_PATHS.get("/" + rest)
        # Anything else (an overlong or NUL id) goes through FastAPI, which answers the 400.
        if target is not None and session and len(session) <= MAX_ID and "\x00" not in session:
            return target[0], session, target[1]
    return None


async def serve_call(
    scope: Scope,
    receive: Receive,
    send: Send,
    endpoint: str,
    path_session: str | None,
    dialect: Dialect | None = None,
) -> None:
    """One call route as a bare ASGI endpoint (see proxy.app.ProxyApp); a dialect's errors in its own shape."""
    try:
        response = await handle(Request(scope, receive, send), endpoint, path_session, dialect)
    except ApiError as exc:
        if "onthejob.call" not in scope:  # refused before it became a call (key, body, limit, spool)
            state = scope["app"].state.onthejob
            state.metrics.observe_refusal(endpoint, dialect.name if dialect else endpoint, exc.status)
        response = _error(exc, dialect)
    except ClientDisconnect:
        return  # gone while sending its body: nobody to answer, nothing was forwarded
    except DATABASE_DOWN as exc:
        log.warning("database unreachable serving %s: %s", scope["path"], type(exc).__name__)
        response = _error(DatabaseUnavailable(), dialect)
    except Exception:
        log.exception("unexpected error serving %s", scope["path"])
        response = _error(
            ApiError("internal error in the proxy; the call may not be recorded", code="internal_error"), dialect
        )
    await response(scope, receive, send)


GEMINI = GeminiDialect()  # Google's error shape, for the Gemini paths below (a call binds its own instance)


def dialect_of(path: str) -> Dialect | None:
    """The dialect whose API a path belongs to (its routes and their sub-routes, under /s/{id}/ too), or None.

    Everything under ``/v1beta/`` is Google's, as is a ``/v1/models/{model}:{method}`` path (the
    google-genai SDK's version); ``GET /v1/models`` and the rest of ``/v1/`` stay OpenAI's.
    """
    if path.startswith("/s/"):
        path = "/" + path[3:].partition("/")[2]
    for prefix, dialect in DIALECT_ROUTES.items():
        if path == prefix or path.startswith(prefix + "/"):
            return dialect
    if path.startswith("/v1beta/") or path == "/v1beta" or (path.startswith("/v1/models/") and ":" in path):
        return GEMINI
    return None


def error_answer(exc: ApiError, path: str) -> Response:
    """One of our errors in the error shape of the API ``path`` belongs to (OpenAI's unless a dialect's)."""
    return _error(exc, dialect_of(path))


def _error(exc: ApiError, dialect: Dialect | None) -> Response:
    if dialect is None:
        return error_response(exc)
    status, body = dialect.error(exc)
    return ORJSONResponse(body, status_code=status, headers=exc.headers)


# The routes below document the call routes; requests for them are served by serve_call first.
@router.post("/v1/chat/completions", openapi_extra=CHAT_DOC, tags=["openai"])
async def chat_completions(request: Request) -> Any:
    """OpenAI chat completions, streaming or not, recorded token-exactly."""
    return await handle(request, "chat")


@router.post("/v1/completions", openapi_extra=COMPLETIONS_DOC, tags=["openai"])
async def completions(request: Request) -> Any:
    """OpenAI text completions, recorded token-exactly."""
    return await handle(request, "completions")


@router.post("/s/{session_id}/v1/chat/completions", openapi_extra=CHAT_DOC, tags=["openai"])
async def session_chat_completions(request: Request, session_id: PathId) -> Any:
    return await handle(request, "chat", path_session=session_id)


@router.post("/s/{session_id}/v1/completions", openapi_extra=COMPLETIONS_DOC, tags=["openai"])
async def session_completions(request: Request, session_id: PathId) -> Any:
    return await handle(request, "completions", path_session=session_id)


def _model(name: str, project: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": project}


@router.get("/v1/models", tags=["openai"])
@router.get("/s/{session_id}/v1/models", tags=["openai"], include_in_schema=False)
async def list_models(request: Request, st: StateDep, page_size: PageSize = 50, page_token: PageToken = None) -> Any:
    """The aliases this key may use (a client with a Google key, ``x-goog-api-key`` or ``?key=``, gets
    Gemini's ``models.list`` answer: google-genai calls this path)."""
    if google_client(request):
        return await models_page(request, page_size, page_token)
    principal = await current_principal(request)
    names = st.router.visible(principal.project_id)
    return {"object": "list", "data": [_model(n, principal.project_id) for n in names]}


@router.get("/v1/models/{model}", tags=["openai"])
@router.get("/s/{session_id}/v1/models/{model}", tags=["openai"], include_in_schema=False)
async def get_model(request: Request, st: StateDep, model: PathId) -> Any:
    """One alias this key may use (OpenAI's ``models.retrieve``; Gemini's ``models.get`` with a Google key)."""
    if google_client(request):
        return await model_answer(request, model)
    principal = await current_principal(request)
    if model not in st.router.visible(principal.project_id):
        raise NotFound(
            f"model {model!r} is not an alias this key may use (GET /v1/models lists them)",
            param="model",
            code="model_not_found",
        )
    return _model(model, principal.project_id)


async def _passthrough(request: Request, st: Any, principal: Any, path: str) -> Response:
    body = await read_json(request, st.settings.max_body_bytes)
    if "model" in body:
        body["model"] = st.router.resolve(principal.project_id, body["model"]).served_model
    try:
        status, reply = await st.upstream.post_json(st.router.replicas.any_up().url, path, body, timeout=30)
    except Exception as exc:  # noqa: BLE001 - any transport failure is the engine's
        raise UpstreamError(f"cannot reach the engine for {path}: {type(exc).__name__}") from exc
    return ORJSONResponse(reply, status_code=status if status < 500 else 502)


@router.post("/tokenize", openapi_extra=TOKENIZER_DOC, tags=["openai"])
async def tokenize(request: Request, principal: PrincipalDep, st: StateDep) -> Response:
    """vLLM's tokenizer, with the alias resolved to the model it serves."""
    return await _passthrough(request, st, principal, "/tokenize")


@router.post("/detokenize", openapi_extra=TOKENIZER_DOC, tags=["openai"])
async def detokenize(request: Request, principal: PrincipalDep, st: StateDep) -> Response:
    return await _passthrough(request, st, principal, "/detokenize")


def completion_view(row: Completion) -> dict[str, Any]:
    """A stored completion: the reply as the client saw it, plus our own capture under ``onthejob``."""
    base = dict(
        row.response or {"object": "chat.completion" if row.endpoint == "chat" else "text_completion", "choices": []}
    )
    base["id"] = row.id
    base["created"] = int(row.created_at.timestamp())
    base["model"] = row.alias
    base["onthejob"] = {
        "session_id": row.session_id,
        "task_id": row.task_id,
        "client_request_id": row.client_request_id,
        "adapter": row.served_model,
        "adapter_version": row.adapter_version,
        "adapter_sha256": row.adapter_sha256,
        "endpoint": row.endpoint,
        "dialect": row.dialect,
        "prompt_token_ids": row.prompt_token_ids,
        "completion_token_ids": [c.get("token_ids") for c in row.choices],
        "logprobs": [c.get("logprobs") for c in row.choices],
        "termination": row.termination,
        "status_code": row.status_code,
        "error": row.error,
        "sampling": row.sampling,
        "tags": row.tags,
        "parent_id": row.parent_id,
        "stream": row.stream,
        "timings": {"latency_ms": row.latency_ms, "ttft_ms": row.ttft_ms},
        "request": row.request,
    }
    if row.client_request is not None or row.client_response is not None:
        base["onthejob"]["client_request"] = row.client_request  # what a dialect's client sent and got
        base["onthejob"]["client_response"] = row.client_response
    return base


@router.get("/v1/chat/completions/{completion_id}", tags=["openai"])
async def get_completion(completion_id: PathId, principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """One stored completion of the caller's project."""
    row = await db.scalar(
        select(Completion).where(Completion.id == completion_id, Completion.project_id == principal.project_id)
    )
    if row is None:
        raise NotFound(
            f"no completion {completion_id!r} (it may still be in the spool; retry shortly)", param="completion_id"
        )
    return completion_view(row)


@router.get("/v1/chat/completions", tags=["openai"])
async def list_completions(
    principal: PrincipalDep,
    db: DbDep,
    session_id: QueryId = None,
    alias: QueryId = None,
    task_id: QueryId = None,
    dialect: Annotated[
        str | None, Query(max_length=16, pattern=NO_NUL, description="the API the client spoke: chat, responses, ...")
    ] = None,
    after: Annotated[
        str | None, Query(max_length=200, pattern=NO_NUL, description="the previous page's last_id")
    ] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict[str, Any]:
    """Stored completions, oldest first, filtered by session, alias, task, dialect and time; paginated by cursor."""
    query = select(Completion).where(Completion.project_id == principal.project_id)
    if session_id:
        query = query.where(Completion.session_id == session_id)
    if alias:
        query = query.where(Completion.alias == alias)
    if task_id:
        query = query.where(Completion.task_id == task_id)
    if dialect:
        query = query.where(Completion.dialect == dialect)
    if since:
        query = query.where(Completion.created_at >= since)
    if until:
        query = query.where(Completion.created_at < until)
    if after:
        anchor = await db.scalar(
            select(Completion).where(Completion.id == after, Completion.project_id == principal.project_id)
        )
        if anchor is None:
            raise NotFound(
                f"no completion {after!r} to continue after: pass the last_id of the previous page", param="after"
            )
        query = query.where(
            (Completion.created_at > anchor.created_at)
            | ((Completion.created_at == anchor.created_at) & (Completion.id > anchor.id))
        )
    rows = (await db.scalars(query.order_by(Completion.created_at, Completion.id).limit(limit + 1))).all()
    page = [completion_view(r) for r in rows[:limit]]
    return {
        "object": "list",
        "data": page,
        "has_more": len(rows) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
