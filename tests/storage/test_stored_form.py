"""The delta form (storage/stored_form.py) reads back exactly what the full form stores, and stores less.

One corpus of call records, as ``ProxiedCall.save`` writes them, goes through the recorder twice:
once in the delta form (the default), once with ``ONTHEJOB_STORED_FORM=full``, each into its own database
(Postgres; SQLite through the portable path). The corpus: a 40-call chain (past two checkpoints:
:data:`CHECKPOINT` is lowered to 16 for it),
a branch (two children of one parent), a call with n=2 choices, streamed calls, a redacted call
(no prompt ids, another history: a mismatch), a session of another project with the same system
prompt and tools (its own shared prefix), and a Responses-dialect chain (stored in full);
retention mid-session in its own test. Every read path is compared: the ORM rows (load event), a
refresh, the GET view, the miner's column read and its real pass (flags), trajectories and the SFT
export. Not here yet: a session deleted mid-way (storage/deletion.py takes whole sessions).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Session

from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.routes_openai import completion_view
from proxy.spool import Spool
from storage import stored_form
from storage.db import async_engine, sync_engine
from storage.export import sft_rows
from storage.migrate import upgrade
from storage.mine_store import _CALL_COLUMNS, expanded, mine
from storage.models import Completion, CompletionFlag
from storage.records import CallRecord
from storage.stored_form import MARK, is_delta
from storage.trajectories import assemble, trajectory_to_dict
from tests.proxy.records import record

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": f"t{i}", "description": "d" * 300}} for i in range(4)]


def chain(session: str, turns: int, *, dialect: str = "chat", start: int = 0) -> list[CallRecord]:
    """One conversation: each call resends the history plus a tool output; prompt ids grow with it."""
    out: list[CallRecord] = []
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys " * 200}]
    ids: list[int] = list(range(1, 300))
    parent = None
    for t in range(turns):
        messages = [*messages, {"role": "user", "content": f"tool output {session} {t} " + "o" * 500}]
        ids = [*ids, *range(1000 + t * 10, 1010 + t * 10)]
        over: dict[str, Any] = {"stream": t % 3 == 0, "dialect": dialect}
        if dialect == "chat":
            over |= {"client_request": None, "client_response": None}
        r = record(
            start + t,
            session=session,
            request={"model": "m", "messages": messages, "tools": TOOLS, "temperature": 0.5},
            prompt_token_ids=ids,
            parent_id=parent,
            **over,
        )
        out.append(r)
        parent = r.id
        messages = [*messages, {"role": "assistant", "content": "ok\u0000"}]
        ids = [*ids, 7, 8]
    return out


CHECKPOINT = 16  # the corpus's checkpoint (the default is longer than any chain here)


def corpus() -> list[CallRecord]:
    main = chain("ses_long", 2 * CHECKPOINT + 8)
    branch = chain("ses_branch", 4)
    fork = record(
        90,
        session="ses_branch",
        parent_id=branch[1].id,
        client_request=None,
        client_response=None,
        dialect="chat",
        request={
            "model": "m",
            "messages": [{"role": "system", "content": "sys " * 200}, {"role": "user", "content": "another way"}],
            "tools": TOOLS,
            "n": 2,
        },
        prompt_token_ids=[1, 2],
        choices=[{"index": 0, "token_ids": [7]}, {"index": 1, "token_ids": [8]}],
    )
    redacted = chain("ses_redacted", 3)
    redacted[2] = record(
        91,
        session="ses_redacted",
        id=redacted[2].id,
        parent_id=redacted[1].id,
        dialect="chat",
        client_request=None,
        client_response=None,
        prompt_token_ids=None,
        request={"model": "m", "messages": [{"role": "user", "content": "[redacted]"}]},
    )
    responses = chain("ses_responses", 5, dialect="responses", start=100)
    other = [replace(r, project_id="q") for r in chain("ses_other", 3, start=120)]
    return [*main, *branch, fork, *redacted, *responses, *other]


async def drain(engine: AsyncEngine, folder: Path, records: list[CallRecord], batch: int) -> None:
    """Spool and drain in batches of ``batch`` records, as a proxy drains turn by turn."""
    spool = Spool(folder, 10**9)
    recorder = Recorder(spool, async_sessionmaker(engine, expire_on_commit=False), Metrics(), batch=500)
    for start in range(0, len(records), batch):
        await asyncio.gather(*(spool.append(r) for r in records[start : start + batch]))
        while spool.depth:
            await recorder.drain_once()
    await recorder.close()
    spool.close()


def record_both(url_full: str, url_delta: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = corpus()
    monkeypatch.setattr(stored_form, "CHECKPOINT", CHECKPOINT)
    for url, form in ((url_full, "full"), (url_delta, "delta")):
        monkeypatch.setenv("ONTHEJOB_STORED_FORM", form)
        engine = async_engine(url)

        async def go(engine: AsyncEngine = engine, form: str = form) -> None:
            await drain(engine, tmp / form, records, batch=3)
            await engine.dispose()

        asyncio.run(go())


def reads(url: str) -> dict[str, Any]:
    """What every read path returns, from one database."""
    eng = sync_engine(url)
    with Session(eng) as db:
        calls = db.scalars(select(Completion).order_by(Completion.id)).all()
        out: dict[str, Any] = {
            "rows": [(c.id, c.request, c.prompt_token_ids, c.choices, c.parent_id, c.dialect) for c in calls],
            "views": [{k: v for k, v in completion_view(c).items() if k != "created"} for c in calls],
        }
        for c in calls[:5]:
            db.expire(c)
            db.refresh(c)
        out["refreshed"] = [(c.request, c.prompt_token_ids) for c in calls[:5]]
        mined = expanded(db, list(db.execute(select(*_CALL_COLUMNS).order_by(Completion.id))))
        out["mined"] = [(r.id, r.parent_id, r.request, r.choices) for r in mined]  # as storage/mine_store.py reads
        passed = mine(db, "p", settle_s=0)
        db.commit()
        flag_columns = (CompletionFlag.completion_id, CompletionFlag.mode)
        flags = db.execute(select(*flag_columns).order_by(*flag_columns)).all()
        out["flags"] = (passed.calls, [tuple(f) for f in flags])
        trajectories = assemble(calls)
        out["trajectories"] = [trajectory_to_dict(t) for t in trajectories]
        out["sft"] = [r for r in sft_rows(trajectories, {c.id: c for c in calls}, None)]
        stored = db.execute(select(Completion.request)).scalars().all()
        out["deltas"] = sum(is_delta(r) for r in stored)
        size = "sum(length(CAST(request AS TEXT)) + coalesce(length(CAST(prompt_token_ids AS TEXT)), 0))"
        out["bytes"] = db.execute(text(f"SELECT {size} FROM completions")).scalar()
    eng.dispose()
    return out


def compare(full: dict[str, Any], delta: dict[str, Any]) -> None:
    assert full["deltas"] == 0
    assert delta["deltas"] > 0
    assert full["flags"][0] > 0  # the miner read the calls
    for path in ("rows", "views", "refreshed", "mined", "flags", "trajectories", "sft"):
        assert delta[path] == full[path], path
        assert repr(delta[path]) == repr(full[path]), path  # key order too
    assert delta["bytes"] < full["bytes"] / 4


def test_every_read_path_sees_the_full_form_postgres(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url_full, url_delta = pg_factory(), pg_factory()
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    compare(reads(url_full), reads(url_delta))


def test_every_read_path_sees_the_full_form_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url_full, url_delta = f"sqlite:///{tmp_path / 'full.db'}", f"sqlite:///{tmp_path / 'delta.db'}"
    upgrade(url_full)
    upgrade(url_delta)
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    compare(reads(url_full), reads(url_delta))


def test_checkpoints_and_what_stays_full(pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url_full, url_delta = pg_factory(), pg_factory()
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    eng = sync_engine(url_delta)
    with Session(eng) as db:
        columns = (Completion.id, Completion.session_id, Completion.dialect, Completion.request, Completion.parent_id)
        query = select(*columns).order_by(Completion.created_at, Completion.id)
        rows = {r.id: r for r in db.execute(query)}
    eng.dispose()
    by_session: dict[str, list[Any]] = {}
    for r in rows.values():
        by_session.setdefault(r.session_id, []).append(r)
    assert all(not is_delta(r.request) for r in by_session["ses_responses"])  # other dialects: in full
    for r in rows.values():
        depth, at = 0, r
        while is_delta(at.request) and "parent" in at.request[MARK]:
            assert at.request[MARK]["parent"] == at.parent_id
            at, depth = rows[at.parent_id], depth + 1
        assert depth < CHECKPOINT  # reading any call touches at most CHECKPOINT rows
    first = by_session["ses_long"][0].request  # a session's first call: in full but its shared prefix
    assert list(first[MARK]) == ["prefix", "messages", "same", "order", "ids"] and first[MARK]["same"] == ["tools"]
    checkpoint = by_session["ses_long"][CHECKPOINT].request
    assert "prefix" in checkpoint[MARK] and len(checkpoint["messages"]) == 2 * CHECKPOINT + 1


def test_prompt_ids_are_shared_only_when_the_parents_are_a_prefix() -> None:
    from storage.stored_form import _ids_suffix

    assert _ids_suffix(b"[1,2,3,4]", b"[1,2,3]") == (3, b"[4]")
    assert _ids_suffix(b"[1,2,3]", b"[1,2,3]") == (3, b"[]")
    assert _ids_suffix(b"[1,2,33]", b"[1,2,3]") is None  # a longer last id is not the same id
    assert _ids_suffix(b"[1,2]", b"[1,2,3]") is None
    assert _ids_suffix(b"[1]", b"[]") is None and _ids_suffix(b"null", b"[1]") is None
    assert _ids_suffix(b"[1]", b"null") is None


def test_retention_mid_session_rewrites_the_oldest_kept_call_in_full(
    pg_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime

    from storage.retention import expire

    url_full, url_delta = pg_factory(), pg_factory()
    record_both(url_full, url_delta, tmp_path, monkeypatch)
    cutoff = datetime(2026, 11, 30, 12, 0, 5, 0, UTC)  # the first five calls of each chat session go
    for url in (url_full, url_delta):
        eng = sync_engine(url)
        with Session(eng) as db:
            assert expire(db, "p", cutoff)["calls"] > 0
        eng.dispose()
    full, delta = reads(url_full), reads(url_delta)
    assert delta["deltas"] > 0
    for path in ("rows", "views", "mined", "trajectories", "sft"):
        assert repr(delta[path]) == repr(full[path]), path


def test_a_record_the_encoder_fails_on_goes_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoding saves space; a failure of it stores the record whole (never quarantined as poison) and
    forgets it as a parent, while the rest of the batch is encoded as usual."""
    from storage.stored_form import Encoder

    calls = chain("ses_fail", 3)
    encoder = Encoder()
    real = stored_form._delta_of

    def flaky(request: Any, *args: Any) -> Any:
        if any("ses_fail 1" in str(m.get("content")) for m in request["messages"][-1:]):
            raise ValueError("a bug in the delta form")
        return real(request, *args)

    monkeypatch.setattr(stored_form, "_delta_of", flaky)
    rows = encoder.encode(calls)
    assert rows[1] is calls[1]  # whole, as given
    third = orjson.loads(rows[2].request)  # its parent is not remembered: a chain begins again (on the prefix)
    assert is_delta(third) and "parent" not in third[MARK] and "prefix" in third[MARK]
    assert "prefix" in orjson.loads(rows[0].request)[MARK]  # the first call as usual


def test_the_proxys_parsed_request_encodes_as_its_bytes_do() -> None:
    """A record that carries its request parsed (the proxy's dict, :attr:`CallRecord.parsed_request`) is
    encoded to the same rows as the one whose bytes the encoder parses itself."""
    from dataclasses import replace

    from storage.stored_form import Encoder

    calls = chain("ses_parsed", 5)
    parsed = [replace(r, parsed_request=orjson.loads(r.request)) for r in calls]
    plain, given = Encoder().encode(calls), Encoder().encode(parsed)
    assert [r.request for r in given] == [r.request for r in plain]
    assert [r.prompt_token_ids for r in given] == [r.prompt_token_ids for r in plain]
    assert sum(is_delta(orjson.loads(r.request)) for r in given) == 5  # the prefix, then parents
    assert all(r.encode() == p.encode() for r, p in zip(given, plain, strict=True))  # never on the spool
