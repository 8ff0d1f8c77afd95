"""Liveness, honest readiness, and Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from proxy.deps import StateDep
from proxy.responses import ORJSONResponse

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(st: StateDep) -> Response:
    """Ready when an engine answers and calls can be recorded (database, or the spool while it is down)."""
    await st.probe_upstreams()
    db_ok = True
    try:
        async with asyncio.timeout(2.0), st.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:  # noqa: BLE001 - any failure means not reachable
        db_ok = False
    spool_ok = st.spool.writable()
    upstream_ok = any(st.upstream_up.values())
    body: dict[str, Any] = {
        "upstream": {u: ("up" if ok else "down") for u, ok in st.upstream_up.items()},
        "database": "up" if db_ok else "down",
        "spool": {
            "writable": spool_ok,
            "depth": st.spool.depth,
            "bytes": st.spool.bytes,
            "oldest_age_s": round(st.spool.oldest_age(), 3),
            "full": st.spool.full,
        },
        "draining": st.draining,
    }
    ready = upstream_ok and spool_ok and not st.draining
    body["status"] = "ready" if ready and db_ok else ("degraded" if ready else "not_ready")
    return ORJSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}, "description": "Prometheus"}},
)
async def metrics(st: StateDep) -> Response:
    st.metrics.spool_depth.set(st.spool.depth)
    st.metrics.spool_age.set(st.spool.oldest_age())
    st.metrics.spool_bytes.set(st.spool.bytes)
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)
