"""The proxy app factory: routers, one error envelope, and a lifespan that owns every resource."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from proxy import (
    routes_admin,
    routes_anthropic,
    routes_datasets,
    routes_dialects,
    routes_feedback,
    routes_monitors,
    routes_openai,
    routes_ops,
    routes_promotion,
    routes_ui,
    routes_ui_learning,
)
from proxy.alert_metrics import AlertMetrics
from proxy.deps import operator_gate
from proxy.dialects import gemini, gemini_routes
from proxy.errors import DATABASE_DOWN, ApiError, DatabaseUnavailable, InvalidRequest
from proxy.memory import tune_for_serving
from proxy.responses import ERROR_RESPONSES, ORJSONResponse
from proxy.routes_openai import error_answer
from proxy.settings import Settings
from proxy.state import AppState
from proxy.trainer_metrics import TrainerMetrics

log = logging.getLogger("onthejob.proxy")


class ProxyApp(FastAPI):
    """FastAPI, except that every call route is served before its layers.

    Dispatched here: a POST to ``/v1/chat/completions``, ``/v1/completions``, or a dialect's
    path (``/v1/messages``, ``/v1/responses``: proxy/routes_openai.py ``call_route``), each also
    under ``/s/{session-id}/`` when the id has at most 200 characters and no NUL (else FastAPI
    answers its 400); and Gemini's ``{model}:generateContent`` and ``:streamGenerateContent``
    under ``/v1beta/models/`` and ``/v1/models/``, with or without ``/s/{session-id}/``
    (proxy/dialects/gemini.py ``call_route``; the edge's admission check refuses a bad id).
    Gemini's ``:countTokens`` and every other route go through FastAPI.

    Those routes take only the request and check the body themselves, yet FastAPI's
    middleware stack, route matching and dependency solving were ~30 % of a call's
    CPU under load (bench/RESULTS.md). They stay declared on the router, so the
    OpenAPI document still describes them.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target = routes_openai.call_route(scope["path"]) or gemini.call_route(scope["path"], scope["query_string"])
            if target is not None:
                scope["app"] = self
                await routes_openai.serve_call(scope, receive, send, *target)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    """A fresh app; nothing is connected until its lifespan starts."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = AppState.build(settings)
        app.state.onthejob = state
        app.state.trainer_metrics = TrainerMetrics(state.sessionmaker)
        state.metrics.registry.register(app.state.trainer_metrics)
        app.state.alert_metrics = AlertMetrics(state.sessionmaker)
        state.metrics.registry.register(app.state.alert_metrics)
        await state.start()
        tune_for_serving()  # the GC and the heap for a serving process (proxy/memory.py)
        try:
            yield
        finally:
            await state.stop()

    open_docs = settings.docs_access == "open"
    app = ProxyApp(
        title="onthejob proxy",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
        openapi_url="/openapi.json" if open_docs else None,
        docs_url="/docs" if open_docs else None,
        redoc_url="/redoc" if open_docs else None,
    )
    for module in (
        routes_openai,
        routes_dialects,
        routes_anthropic,
        gemini_routes,
        routes_feedback,
        routes_admin,
        routes_datasets,
        routes_promotion,
        routes_monitors,
        routes_ops,
        routes_ui,
        routes_ui_learning,
    ):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    if settings.docs_access == "admin":
        app.include_router(_gated_docs(app))

    _error_envelope(app)
    return app


def _error_envelope(app: FastAPI) -> None:
    """Every route answers errors in its API's shape (OpenAI's envelope, or a dialect's), whatever they are.

    Our own errors as they are; validation and routing errors as 400/404/405 and so on; the
    database not answering as 503 with Retry-After; anything else as a 500 in the envelope, never
    Starlette's plain-text page (Starlette still re-raises it after answering, so it is logged).
    """

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_answer(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        message = f"{field or 'request'}: {first.get('msg', 'invalid')}"
        return error_answer(InvalidRequest(message, param=field or None, code="invalid_value"), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        error = ApiError(str(exc.detail), code=exc.status_code, headers=getattr(exc, "headers", None))
        error.status = exc.status_code
        error.type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_answer(error, request.url.path)

    async def database_down(request: Request, exc: Exception) -> Response:
        log.warning("database unreachable serving %s %s: %s", request.method, request.url.path, type(exc).__name__)
        return error_answer(DatabaseUnavailable(), request.url.path)

    for kind in DATABASE_DOWN:
        app.add_exception_handler(kind, database_down)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        error = ApiError(f"internal error in the proxy ({type(exc).__name__}); it is logged", code="internal_error")
        return error_answer(error, request.url.path)


def _gated_docs(app: FastAPI) -> APIRouter:
    """/openapi.json, /docs and /redoc behind the operator's admin key (``ONTHEJOB_DOCS_ACCESS=admin``).

    A browser does not send the key when Swagger UI fetches the spec: read the spec with
    ``curl -H "Authorization: Bearer $ADMIN_KEY" .../openapi.json``, or serve docs ``open``.
    """
    router = APIRouter(include_in_schema=False, dependencies=[Depends(operator_gate("docs_access"))])

    @router.get("/openapi.json")
    async def openapi() -> ORJSONResponse:
        return ORJSONResponse(app.openapi())

    @router.get("/docs")
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")

    return router
