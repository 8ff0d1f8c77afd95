"""Every route, generated from the app's own route table, tried with another project's keys.

Project A owns data; project B (harness and admin keys) asks for it by A's real
ids. Nothing of A may come back: 404/403, a 202 pending feedback that never
attaches, or B's own (empty) data. New routes are covered automatically.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from fastapi.routing import APIRoute
from sqlalchemy import select
from sqlalchemy.orm import Session

import proxy as proxy_package
from proxy.app import create_app
from proxy.settings import Settings
from storage.db import sync_engine
from storage.models import ApiKey, Feedback
from tests.proxy.conftest import ProxyFactory, make_key

PRIVATE = "A-PRIVATE-TEXT-7731"


def _routes() -> list[tuple[str, str]]:
    app = create_app(Settings(upstreams=["http://127.0.0.1:1"]))
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            out.extend((method, route.path) for method in sorted(route.methods - {"HEAD"}))
    return out


def test_the_route_table_is_what_this_test_knows() -> None:
    paths = {p for _, p in _routes()}
    assert {"/v1/feedback", "/v1/admin/deployments", "/v1/sessions/{session_id:path}"} <= paths


UI = Path(proxy_package.__file__).parent / "ui"


def _shape(path: str) -> str:
    return re.sub(r"\$\{[^}]*\}|\{[^}]*\}", "{}", path)


def test_every_route_the_dashboard_calls_is_in_the_matrix() -> None:
    called = {
        _shape(m.group(1))
        for script in UI.glob("*.js")
        for m in re.finditer(r"[\"`](/(?:v1/|tokenize|detokenize)[^\"`?]*)", script.read_text())
    }
    assert {
        "/v1/ui/calls",
        "/v1/sessions/{}",
        "/v1/admin/deployments",
        "/detokenize",
        "/v1/ui/promotions",
        "/v1/ui/datasets/{}",
        "/v1/ui/aliases/{}/versions/{}/lineage",
        "/v1/admin/aliases/{}/policy",
        "/v1/admin/datasets",
    } <= called
    served = {_shape(p) for _, p in _routes()}
    missing = called - served
    assert not missing, f"the dashboard calls routes the proxy does not serve: {sorted(missing)}"


def test_no_route_leaks_another_projects_data(start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any) -> None:
    db_url = pg_factory()
    a_harness, a_admin = make_key(db_url, "proj-a", "harness"), make_key(db_url, "proj-a", "admin")
    b_harness, b_admin = make_key(db_url, "proj-b", "harness"), make_key(db_url, "proj-b", "admin")
    proxy = start_proxy(stub_upstream, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    as_a = {"authorization": f"Bearer {a_admin}"}
    # Project A: an alias, a call in a named session, feedback on it.
    assert (
        httpx.post(
            f"{proxy.v1}/admin/aliases",
            headers=as_a,
            timeout=10,
            json={"name": "a-private-alias", "base_model": "stub-model"},
        ).status_code
        == 201
    )
    call = httpx.post(
        f"{proxy.v1}/chat/completions",
        timeout=10,
        headers={
            "authorization": f"Bearer {a_harness}",
            "x-session-id": "a-session-1",
            "x-client-request-id": "a-client-req",
        },
        json={"model": "a-private-alias", "max_tokens": 3, "messages": [{"role": "user", "content": PRIVATE}]},
    )
    assert call.status_code == 200
    a_completion = call.headers["x-request-id"]
    proxy.wait_drained()
    httpx.post(
        f"{proxy.v1}/feedback",
        headers={"authorization": f"Bearer {a_harness}"},
        timeout=10,
        json={"target": {"completion_id": a_completion}, "name": "thumbs", "value": True},
    )
    eng = sync_engine(db_url)
    with Session(eng) as db:
        a_key_id = db.scalar(select(ApiKey.id).where(ApiKey.project_id == "proj-a", ApiKey.role == "harness"))
    # ... and a dataset holding that session (B asks for it by name, and diffs it against itself).
    a_set = {"name": "a-private-set", "filter": {"alias": "a-private-alias"}}
    assert httpx.post(f"{proxy.v1}/admin/datasets", headers=as_a, timeout=10, json=a_set).status_code == 201
    a_values = {
        "completion_id": a_completion,
        "session_id": "a-session-1",
        "key_id": str(a_key_id),
        "name": "a-private-set",
        "other": "a-private-set",
        "alias": "a-private-alias",
        "version": "1",
    }
    secrets = [PRIVATE, a_completion, "a-session-1", "a-private-alias", str(a_key_id), a_harness, a_admin]

    bodies: dict[str, Any] = {
        "/v1/chat/completions": {"model": "a-private-alias", "messages": [{"role": "user", "content": "x"}]},
        "/v1/completions": {"model": "a-private-alias", "prompt": "x"},
        "/v1/feedback": {"target": {"completion_id": a_completion}, "name": "thumbs", "value": False},
        "/v1/admin/deployments": {"alias": "a-private-alias", "version": 1},
        "/v1/admin/aliases": {"name": "b-alias", "base_model": "stub-model"},
        "/v1/admin/keys": {"role": "harness"},
        "/v1/admin/project": {"redact": {"store_text": True, "patterns": []}},
        "/v1/admin/datasets": {"name": "b-set", "filter": {"alias": "a-private-alias"}},  # B's own, empty
        "/tokenize": {"model": "a-private-alias", "prompt": "x"},
        "/detokenize": {"model": "a-private-alias", "tokens": [1]},
    }
    queries = {"completion_id": a_completion, "session_id": "a-session-1", "alias": "a-private-alias"}
    tried = 0
    for method, path in _routes():
        if path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
            continue
        url = proxy.url + re.sub(r"{(\w+)(:path)?}", lambda m: a_values.get(m.group(1), "a-session-1"), path)
        template = re.sub(r"/s/{session_id}", "", path)
        for name, key in (("harness", b_harness), ("admin", b_admin)):
            resp = httpx.request(
                method,
                url,
                headers={"authorization": f"Bearer {key}"},
                timeout=10,
                params=queries if method == "GET" else None,
                json=bodies.get(template) if method in ("POST", "PUT") else None,
            )
            tried += 1
            where = f"{method} {path} as project B {name}: {resp.status_code} {resp.text[:300]}"
            assert resp.status_code < 500, where
            sent = url + str(bodies.get(template)) + (str(queries) if method == "GET" else "")
            for secret in secrets:
                # Echoing what B itself sent is no leak (and reads the same for ids that exist nowhere).
                assert secret in sent or secret not in resp.text, f"leaked {secret!r}: {where}"
            if path.startswith("/v1/admin/") and name == "harness":
                assert resp.status_code == 403, where
            elif "{" in path and method == "GET" and not path.startswith("/s/"):
                assert resp.status_code == 404, where
            elif method == "POST" and template in (
                "/v1/chat/completions",
                "/v1/completions",
                "/tokenize",
                "/detokenize",
            ):
                assert resp.status_code == 404 and "model_not_found" in resp.text, where
            elif template == "/v1/admin/deployments" and method == "POST":
                assert resp.status_code == 404, where
            elif path == "/v1/admin/keys/{key_id}":
                assert resp.status_code in (403, 404), where
            elif path == "/v1/feedback" and method == "POST":
                assert resp.status_code == 202, where
    assert tried >= 30
    # B's feedback naming A's completion stayed pending: it never attached to A's call.
    with Session(eng) as db:
        leaked = db.scalars(
            select(Feedback).where(Feedback.project_id == "proj-b", Feedback.attached_at.is_not(None))
        ).all()
        a_grades = db.scalars(select(Feedback).where(Feedback.completion_id == a_completion)).all()
    eng.dispose()
    assert not leaked and {f.project_id for f in a_grades} == {"proj-a"}
