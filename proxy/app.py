"""The proxy app factory: routers, one error envelope, and a lifespan that owns every resource."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
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
from proxy.errors import ApiError, envelope
from proxy.memory import tune_for_serving
from proxy.responses import ERROR_RESPONSES, ORJSONResponse, error_response
from proxy.settings import Settings
from proxy.state import AppState
from proxy.trainer_metrics import TrainerMetrics


class ProxyApp(FastAPI):
    """FastAPI, except that the OpenAI call routes are served before its layers.

    Those routes take only the request and check the body themselves, yet FastAPI's
    middleware stack, route matching and dependency solving were ~30 % of a call's
    CPU under load (bench/RESULTS.md). They stay declared on the router, so the
    OpenAPI document still describes them.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target = routes_openai.call_route(scope["path"])
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

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> ORJSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> ORJSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        message = f"{field or 'request'}: {first.get('msg', 'invalid')}"
        return ORJSONResponse(envelope(message, "invalid_request_error", field or None, "invalid_value"), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> ORJSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = envelope(str(exc.detail), kind, None, exc.status_code)
        return ORJSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    return app


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
