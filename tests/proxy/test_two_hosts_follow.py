"""Two proxy hosts, each with its own engine: a deployment and a delete made through one reach the other.

Two real ``onthejob serve`` processes (own spool roots, own host ids) share only Postgres; each sends its
calls to its own stub engine (one ``bench.stub_upstream`` process each), so host a never talks to host b's
engine. What one host does reaches the other only through the database: the alias table, which every
worker reads each ``alias_refresh_s`` (proxy/state.py), and the change log's deletion entries, which every
worker reads each ``FOLLOW_S`` (proxy/link_deletes.py). The stub is used for its instant, controllable
replies: this is about the proxy following the database, not the model (tests/proxy/test_engine_replicas.py
deploys to real engines behind one proxy).

The two hosts, their engines and their database are started once for the module (starting two hosts takes
most of a test's time): the tests touch disjoint things (the ``helper`` alias; a session of ``stub-model``),
so either order gives each the state it starts from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import httpx
import orjson
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from proxy.link_deletes import FOLLOW_S
from storage.db import sync_engine
from storage.models import Completion
from storage.models import Session as SessionRow
from tests.proxy.conftest import Proxy, add_adapter, launch_proxy, metric_sample, stub_engine

BOUND_S = 15.0  # the longest host b is given to follow what host a did (the contract: about a second)


def _until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy (returned), failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)
    return result


class Hosts(NamedTuple):
    a: Proxy
    b: Proxy
    engine_a: str  # host a's stub engine
    engine_b: str  # host b's: host a never talks to it
    db_url: str


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, pg_factory: Any) -> Iterator[Hosts]:
    """Hosts a and b, each in front of its own engine, once each sees the other live (``/readyz``'s ``hosts``).

    The ``helper`` alias and a committed version of it, as the trainer's publish leaves one (the stub loads no
    weights), are made through host a before host b starts, so that b knows the alias from its first read of
    the table (the deployment test's starting point; nothing deploys it here).
    """
    tmp = tmp_path_factory.mktemp("two-hosts-follow")
    db_url = pg_factory()
    with stub_engine(tmp / "stub-a.log") as engine_a, stub_engine(tmp / "stub-b.log") as engine_b:
        started: list[Proxy] = []
        try:
            a = launch_proxy(tmp, engine_a, db_url, spool=tmp / "spool-a", env={"ONTHEJOB_HOST_ID": "a"})
            started.append(a)
            made = httpx.post(f"{a.v1}/admin/aliases", json={"name": "helper", "base_model": "stub-model"}, timeout=10)
            assert made.status_code == 201, made.text
            add_adapter(db_url, "default", "helper", 1, tmp / "helper" / "v1", "stub-model")
            b = launch_proxy(tmp, engine_b, db_url, spool=tmp / "spool-b", env={"ONTHEJOB_HOST_ID": "b"})
            started.append(b)

            def both_live() -> bool:
                return all(httpx.get(f"{h.url}/readyz", timeout=5).json()["hosts"] == 2 for h in (a, b))

            _until("the hosts see each other", both_live)
            yield Hosts(a, b, engine_a, engine_b, db_url)
        finally:
            for proxy in started:
                proxy.stop()


def _row(db_url: str, call: str) -> Completion:
    """The recorded call once its host's recorder has drained it."""
    eng = sync_engine(db_url)
    try:
        with Session(eng) as db:
            return _until(f"call {call} recorded", lambda: db.get(Completion, call), timeout=60)  # type: ignore[no-any-return]
    finally:
        eng.dispose()


def _served_version(host: Proxy, model: str) -> int | None:
    """Call ``model`` through ``host``; the adapter version that served it, as recorded (None: the base model)."""
    r = httpx.post(
        f"{host.v1}/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "which version?"}], "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return _row(host.db_url, r.headers["x-request-id"]).adapter_version


def test_a_deployment_through_host_a_is_routed_by_host_b_and_loaded_into_its_engine(hosts: Hosts) -> None:
    """Deploy ``helper@v1`` through host a; host b's calls to ``helper`` are then served by v1, and host b
    loads v1 into its own engine, which host a never talks to.

    Fails if host b does not follow the alias table (its ``_follow`` refresh): b keeps routing ``helper`` to
    the base model (checked first, so the poll's signal tells the two apart) and its engine never gets v1;
    or if it follows later than ``BOUND_S``. Checked by hand on a copy of the tree: with ``alias_refresh_s``
    at 3600 s (b reads the table once, at its start) it fails at "not within 15 s: host b serves helper from v1".
    """
    a, b, stub_upstream, stub_b = hosts.a, hosts.b, hosts.engine_a, hosts.engine_b
    # Before the deployment, host b serves helper from the base model.
    _until("host b knows the alias", lambda: "helper" in _listed(b))
    assert _served_version(b, "helper") is None

    r = httpx.post(f"{a.v1}/admin/deployments", json={"alias": "helper", "version": 1}, timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["replicas"] == {stub_upstream: "loaded"}  # host a loaded its own engine, and only that one
    assert "helper@v1" not in _models(stub_b)

    _until("host b serves helper from v1", lambda: _served_version(b, "helper") == 1, timeout=BOUND_S)
    _until("host b loads v1 into its own engine", lambda: "helper@v1" in _models(stub_b), timeout=BOUND_S)
    assert _served_version(a, "helper") == 1


def _models(engine: str) -> set[str]:
    """What an engine lists (its base model and the adapter versions loaded into it)."""
    return {m["id"] for m in httpx.get(f"{engine}/v1/models", timeout=10).json()["data"]}


def _listed(host: Proxy) -> set[str]:
    """The models a host offers its callers (its aliases)."""
    return {m["id"] for m in httpx.get(f"{host.v1}/models", timeout=10).json()["data"]}


def _turn(host: Proxy, messages: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """One chat turn through ``host``: its call id, its session id and the reply's message."""
    r = httpx.post(
        f"{host.v1}/chat/completions", json={"model": "stub-model", "messages": messages, "max_tokens": 4}, timeout=60
    )
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"], r.headers["x-session-id"], r.json()["choices"][0]["message"]


class SlowTurn(threading.Thread):
    """A streamed turn through a host that takes ``chunks`` × ``gap_ms`` to end; its headers as soon as they come."""

    def __init__(self, host: Proxy, messages: list[dict[str, Any]], chunks: int = 30, gap_ms: int = 100) -> None:
        super().__init__(daemon=True)
        self.body = {
            "model": "stub-model",
            "messages": messages,
            "max_tokens": chunks,
            "stream": True,
            "stub_gap_ms": gap_ms,
        }
        self.url = f"{host.v1}/chat/completions"
        self.started = threading.Event()
        self.headers: dict[str, str] = {}
        self.content = ""
        self.ended = 0.0  # time.monotonic() when the last byte came
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=60) as r:
                assert r.status_code == 200, r.read()
                self.headers = dict(r.headers)
                self.started.set()
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for choice in orjson.loads(line[6:]).get("choices") or []:
                            self.content += (choice.get("delta") or {}).get("content") or ""
            self.ended = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            self.error = exc
            self.started.set()


def test_a_session_deleted_through_host_a_is_not_continued_by_host_b_and_its_calls_never_land(
    hosts: Hosts,
) -> None:
    """A conversation alternates between the hosts (a, b, a, b: one session), then a fifth turn streams slowly
    through b; while it streams, the session is deleted through a. The slow turn ends after the delete and goes
    into b's spool. Then the whole history plus a new user turn is sent through b, whose link cache held
    the conversation (it answered turns 2, 4 and 5).

    Fails if host b does not follow the change log's deletion entries (proxy/link_deletes.py): b's link
    cache then continues the deleted session, the resent turn gets the deleted session's id and lands in it.
    Fails too if b's recorder lands the slow turn (made before the delete) from its spool: then it is in the
    database, b links the resent turn to it, and the database still holds it. Checked by hand on a copy of the
    tree: without the ``Deletes.follow`` task (proxy/state.py), and with ``Recorder._drop_deleted`` keeping
    every record, each fails at "host b continued the session deleted through host a".
    """
    a, b, db_url = hosts.a, hosts.b, hosts.db_url
    hosts = [a, b, a, b]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "a conversation across two hosts"}]
    calls, sessions = [], set()
    for n, host in enumerate(hosts):
        call, session, reply = _turn(host, messages)
        calls.append(call)
        sessions.add(session)
        messages += [reply, {"role": "user", "content": f"turn {n + 1}"}]
        # Landed before the next turn: the other host finds its parent in the database at once (linking at
        # agent speed, before the parent lands, is tests/proxy/test_two_hosts.py's).
        assert _row(db_url, call).session_id == session
    (deleted,) = sessions  # the hosts linked each turn to the one before: one session

    # 3 s of streaming: the delete returns in about 0.25 s on a quiet machine, so the turn still ends after it
    # with room for a loaded one (and the test says so, below, if it ever does not); longer only waits.
    slow = SlowTurn(b, messages)
    slow.start()
    assert slow.started.wait(30) and slow.error is None, slow.error
    assert slow.headers["x-session-id"] == deleted  # the fifth turn continues it too
    r = httpx.delete(f"{a.v1}/admin/sessions/{deleted}", timeout=30)
    deleted_at = time.monotonic()
    assert r.status_code == 200, r.text
    assert r.json()["deleted"]["calls"] == 4
    slow.join(60)
    assert not slow.is_alive() and slow.error is None, slow.error
    assert slow.ended > deleted_at, "setup: the slow turn ended before the delete returned; make it slower"
    calls.append(slow.headers["x-request-id"])
    messages += [{"role": "assistant", "content": slow.content}, {"role": "user", "content": "and after the delete?"}]

    # Host b learns of the delete from the change log within about FOLLOW_S (the architecture's contract: a
    # call in that second may still link); give it a few times that before the resend.
    time.sleep(max(0.0, deleted_at + 3 * FOLLOW_S - time.monotonic()))
    resent, session, _ = _turn(b, messages)
    assert session != deleted, "host b continued the session deleted through host a"

    a.wait_drained(timeout=60)
    b.wait_drained(timeout=60)
    row = _row(db_url, resent)
    assert (row.session_id, row.parent_id) == (session, None)  # a new session, linked to nothing
    eng = sync_engine(db_url)
    try:
        with Session(eng) as db:
            assert db.scalars(select(Completion.id).where(Completion.id.in_(calls))).all() == []
            assert db.scalars(select(Completion.id).where(Completion.session_id == deleted)).all() == []
            assert db.get(SessionRow, ("default", deleted)) is None
    finally:
        eng.dispose()
    # The slow turn did reach b's spool after the delete, and b's recorder dropped it there.
    dropped = metric_sample(
        httpx.get(f"{b.url}/metrics", timeout=10).text, "onthejob_records_dropped_total", reason="deleted"
    )
    assert dropped is not None and dropped >= 1
