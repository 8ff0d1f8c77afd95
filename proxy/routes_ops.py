"""Liveness, honest readiness, and Prometheus metrics.

``/readyz`` only looks: it asks each engine for its models, the database for ``SELECT 1``
and the spool whether it can write, and shows each engine replica as this worker
routes to it (``replicas``: in rotation or not, calls in flight, adapter versions
listed and still missing). It never reloads adapters or changes what the proxy
believes (the probes do that, proxy/engine_adapters.py); a probe that acts would run repairs
at the rate a load balancer polls.

Anyone may ask (a load balancer has no key), so without the operator's admin key (or with
auth off) it shows states and counts only: adapter names (``project~alias@vN``) name other
tenants, engine addresses and raw error strings describe the deployment.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from proxy.deps import StateDep, operator_gate
from proxy.errors import ApiError
from proxy.responses import ORJSONResponse

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, st: StateDep) -> Response:
    """Ready when an engine answers and calls can be recorded (database, or the spool while it is down,
    with the redaction policies known: from the database, or the last copy beside the spool).

    Engines, adapter names and errors are shown to the operator's admin key; anyone else sees counts."""
    answers = await asyncio.gather(*(_engine_answers(st, base) for base in st.upstream.urls))
    upstream = dict(zip(st.upstream.urls, answers, strict=True))
    db_ok = True
    try:
        async with asyncio.timeout(2.0), st.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:  # noqa: BLE001 - any failure means not reachable
        db_ok = False
    spool_ok = st.spool.writable()
    upstream_ok = any(answers)
    needed = st.router.needed()
    body: dict[str, Any] = {
        "upstream": {u: ("up" if ok else "down") for u, ok in upstream.items()},
        "replicas": {r.url: r.state(needed) for r in st.router.replicas.replicas},
        "database": "up" if db_ok else "down",
        "spool": {
            "writable": spool_ok,
            "depth": st.spool.depth,
            "bytes": st.spool.bytes,
            "oldest_age_s": round(st.spool.oldest_age(), 3),
            "full": st.spool.full,
        },
        "draining": st.draining,
        "policies": st.recording.policies.source,
        "hosts": st.leases.hosts if st.leases is not None else 1,  # live proxy hosts on this database
    }
    # A worker that knows no project's redaction policy refuses every recorded call (it fails closed):
    # not ready, so a load balancer sends the calls to a sibling that can take them.
    policies_ok = not st.recording.enabled or body["policies"] != "none"
    ready = upstream_ok and spool_ok and policies_ok and not st.draining
    body["status"] = "ready" if ready and db_ok else ("degraded" if ready else "not_ready")
    if not await _operator(request, st):
        body["upstream"] = {"up": sum(answers), "down": len(answers) - sum(answers)}
        body["replicas"] = [_counts(r) for r in body["replicas"].values()]
    return ORJSONResponse(body, status_code=200 if ready else 503)


async def _operator(request: Request, st: Any) -> bool:
    """Whether the caller holds an admin key of the operator's project (everyone does with auth off)."""
    headers = request.headers
    authorization, api_key = headers.get("authorization"), headers.get("x-api-key")
    if st.settings.auth and not (authorization or api_key):
        return False
    client = request.client.host if request.client else None
    try:
        principal = await st.auth.authenticate(authorization, api_key, client=client)
    except ApiError:  # an unknown key, or none verifiable now: readiness is still answered, as counts
        return False
    return bool(principal.role == "admin" and principal.project_id == st.settings.default_project)


def _counts(replica: dict[str, Any]) -> dict[str, Any]:
    """A replica as /readyz shows it without the operator's key: states, numbers, and how many of each list.

    Any text but the state (adapter names, the raw last error) is left out, a field added later included."""
    out: dict[str, Any] = {}
    for key, value in replica.items():
        if key == "last_error":
            out["errored"] = value is not None
        elif isinstance(value, list | set | tuple | dict):
            out[key] = len(value)
        elif key == "state" or isinstance(value, bool | int | float):
            out[key] = value
    return out


async def _engine_answers(st: Any, base: str) -> bool:
    try:
        status, _ = await st.upstream.get_json(base, "/v1/models", timeout=2.0)
    except Exception:  # noqa: BLE001 - unreachable engine
        return False
    return bool(status == 200)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}, "description": "Prometheus"}},
    dependencies=[Depends(operator_gate("metrics_access"))],
)
async def metrics(request: Request, st: StateDep) -> Response:
    """Prometheus: the proxy's own counters, the trainer's newest step per alias and the open alerts (from storage)."""
    await request.app.state.trainer_metrics.refresh()
    await request.app.state.alert_metrics.refresh()
    st.metrics.spool_depth.set(st.spool.depth)
    st.metrics.spool_age.set(st.spool.oldest_age())
    st.metrics.spool_bytes.set(st.spool.bytes)
    st.metrics.calls.spooled = st.spool.appended
    st.metrics.calls.link_lookups = st.linker.lookups
    st.metrics.calls.link_waited = st.linker.waited
    st.router.replicas.export(st.metrics)
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)
