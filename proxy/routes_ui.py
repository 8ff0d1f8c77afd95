"""The dashboard: the page at ``/ui`` (static files of proxy/ui/) and the JSON it reads under ``/v1/ui/``.

The page holds no data: it asks for a key, keeps it in ``sessionStorage`` and calls
these routes (and the public ones: sessions, trajectories, feedback, admin) with it,
so a key sees its own project only and admin actions stay with admin keys. The page
is served with a Content-Security-Policy that allows scripts, styles and requests from
this origin only, and no inline script; the scripts write recorded text with
``textContent`` only (tests/proxy/test_ui.py plants markup and checks).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from proxy.deps import DbDep, PathId, PrincipalDep, QueryId, StateDep
from proxy.errors import InvalidRequest, NotFound
from storage import dashboard, dashboard_learning
from storage.loaders import project_rule_async

router = APIRouter(tags=["ui"])

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-cache",
}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}
Limit = Annotated[int, Query(ge=1, le=200)]
Filter = Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00]*$")]
Version = Annotated[str | None, Query(pattern=r"^([0-9]{1,9}|base)$", description="an adapter version, or base")]
Flag = Annotated[Literal["error", "cut_short", "stream", "linked", "ambiguous_link"] | None, Query()]
Grade = Annotated[Literal["graded", "ungraded"] | None, Query()]


def _asset(name: str) -> Response:
    """A file of proxy/ui/ (a fixed list: nothing else of the package is reachable)."""
    folder = resources.files("proxy") / "ui"
    names = {p.name for p in folder.iterdir() if p.name.endswith((".js", ".css", ".html"))}
    if name not in names:
        raise NotFound(f"no dashboard file {name!r}", param="path")
    body = (folder / name).read_bytes()
    return Response(body, media_type=TYPES["." + name.rsplit(".", 1)[1]], headers=PAGE_HEADERS)


@router.get("/ui", include_in_schema=False)
async def page() -> Response:
    """The dashboard's one page."""
    return _asset("index.html")


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: PathId) -> Response:
    return _asset(name)


@router.get("/v1/ui/me")
async def me(principal: PrincipalDep) -> dict[str, Any]:
    """Who the key is: its project and role (the page shows admin controls to admin keys)."""
    return {"project": principal.project_id, "role": principal.role}


@router.get("/v1/ui/overview")
async def overview(principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """Headline counts of the caller's project."""
    return await dashboard.overview(db, principal.project_id)


@router.get("/v1/ui/calls")
async def calls(
    principal: PrincipalDep,
    db: DbDep,
    alias: Filter = None,
    version: Version = None,
    tag: Filter = None,
    dialect: Filter = None,
    termination: Filter = None,
    flag: Flag = None,
    grade: Grade = None,
    session_id: QueryId = None,
    mined: Filter = None,
    before: Filter = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """Calls newest first, filtered; ``before`` is the previous page's ``next_cursor``; ``total`` counts all matches."""
    flt = dashboard.CallFilter(alias, version, tag, dialect, termination, flag, grade, session_id, mined)
    rule = await project_rule_async(db, principal.project_id)
    try:
        return await dashboard.calls_page(db, principal.project_id, flt, rule, before=before, limit=limit)
    except dashboard.FilterError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    except dashboard.UnknownCursor:
        raise _no_cursor(before) from None


def _no_cursor(before: str | None) -> NotFound:
    return NotFound(f"no row {before!r} to continue after: pass the previous page's next_cursor", param="before")


@router.get("/v1/ui/sessions")
async def sessions(
    principal: PrincipalDep,
    db: DbDep,
    alias: Filter = None,
    tag: Filter = None,
    before: Filter = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """Sessions, most recently active first, with their calls and feedback counted."""
    try:
        return await dashboard.sessions_page(db, principal.project_id, alias=alias, tag=tag, before=before, limit=limit)
    except dashboard.UnknownCursor:
        raise _no_cursor(before) from None


@router.get("/v1/ui/sessions/{session_id:path}/turns")
async def turns(session_id: PathId, principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """Each call of the session: the messages it added, tools offered, what it answered."""
    data = await dashboard.session_turns(db, principal.project_id, session_id)
    if data is None:
        raise NotFound(f"no session {session_id!r} in this project", param="session_id", code="session_not_found")
    return {"object": "list", "session_id": session_id, "data": data}


@router.get("/v1/ui/learning")
async def learning(principal: PrincipalDep, db: DbDep, alias: QueryId = None) -> dict[str, Any]:
    """Reward over time per alias and version, deployments and rollbacks, training runs."""
    rule = await project_rule_async(db, principal.project_id)
    reward = await dashboard_learning.reward_series(db, principal.project_id, rule, alias)
    return {
        **reward,
        "events": await dashboard_learning.deployment_events(db, principal.project_id, alias),
        "runs": await dashboard_learning.training_runs(db, principal.project_id, alias),
    }


@router.get("/v1/ui/runs/{run_id}")
async def run(run_id: PathId, principal: PrincipalDep, db: DbDep) -> dict[str, Any]:
    """One training run of the caller's project with every step's metrics."""
    found = await dashboard_learning.run_steps(db, principal.project_id, int(run_id)) if run_id.isdigit() else None
    if found is None:
        raise NotFound(f"no training run {run_id!r} in this project", param="run_id")
    return found


def _counter_total(counter: Any) -> float:
    return float(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


@router.get("/v1/ui/health")
async def health(principal: PrincipalDep, st: StateDep) -> dict[str, Any]:
    """Each engine replica and this project's adapters on it; for the operator, the spool and records too.

    Replica state is what this worker's router knows (proxy/replicas.py, as /readyz shows it), filtered to
    the caller's adapter versions. The spool, the record counters, replica URLs and errors hold every
    project's traffic, so only the operator (an admin key of the default project, as for /metrics) sees
    them; other keys get ``null`` there.
    """
    operator = principal.role == "admin" and principal.project_id == st.settings.default_project
    mine = _own_names(principal.project_id)
    needed = st.router.needed()
    replicas = []
    for i, replica in enumerate(st.router.replicas.replicas):
        state = replica.state(needed)
        row = {"replica": i, "state": state["state"], "since": state["since"], "inflight": state["inflight"]}
        for key in ("adapters", "missing", "excluded"):
            row[key] = sorted(mine(name) for name in state[key] if mine(name))
        if operator:
            row.update(url=replica.url, last_error=state["last_error"])
        replicas.append(row)
    out: dict[str, Any] = {"operator": operator, "draining": st.draining, "replicas": replicas}
    if not operator:
        return {**out, "spool": None, "records": None}
    m, spool = st.metrics, st.spool
    out["spool"] = {
        "depth": spool.depth,
        "bytes": spool.bytes,
        "oldest_age_s": round(spool.oldest_age(), 3),
        "full": spool.full,
        "writable": spool.writable(),
    }
    # Spooled: the spool's own count (what /metrics exports as onthejob_records_spooled_total).
    out["records"] = {
        "spooled": float(spool.appended),
        "written": _counter_total(m.records_written),
        "dropped": _counter_total(m.records_dropped),
    }
    return out


def _own_names(project: str) -> Callable[[str], str]:
    """Engine-side adapter name -> ``alias@vN`` when it is this project's (proxy.routing.lora_name), else ""."""
    prefix = "" if project == "default" else f"{project}~"

    def own(name: str) -> str:
        if prefix:
            return name[len(prefix) :] if name.startswith(prefix) else ""
        return "" if "~" in name else name

    return own
