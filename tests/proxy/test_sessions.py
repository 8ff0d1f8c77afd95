"""Message-level linking: a follow-up call finds its parent by its own message prefixes."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session

from proxy import link_keys
from proxy.link_keys import Naming, link_key, naming, prefix_keys
from proxy.sessions import Link, LinkCache, Linker
from proxy.spool import Spool
from storage.db import async_engine, sync_engine
from storage.models import Completion, Project
from tests.proxy.records import record


def test_a_follow_up_finds_the_previous_turn() -> None:
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    reply = {"role": "assistant", "content": "a1", "refusal": None}
    key = link_key(prefix_keys(first)[-1], reply)
    # The SDK echoes the assistant message back with different optional fields; it still links.
    follow = [*first, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "42", "tool_call_id": "t"}]
    assert prefix_keys(follow)[2] == key
    cache = LinkCache()
    cache.put("p", key, Link("s1", "c1", None))
    assert cache.longest("p", prefix_keys(follow), None) == Link("s1", "c1", None)
    assert cache.longest("other-project", prefix_keys(follow), None) is None
    assert cache.longest("p", prefix_keys(follow), "another-session") is None
    changed = [*first[:1], {"role": "user", "content": "different"}, {"role": "assistant", "content": "a1"}]
    assert cache.longest("p", prefix_keys(changed), None) is None


def test_content_parts_and_tool_calls_normalise() -> None:
    a = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    b = [{"role": "user", "content": "hi"}]
    assert prefix_keys(a) == prefix_keys(b)
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    same = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "y", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert prefix_keys([call]) == prefix_keys([same])


def test_remembered_keys_are_the_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys of messages already hashed are found, not hashed again, and are what hashing gives: for
    texts of one length and the same ends, tool calls, names, content parts, and after the memory is full."""

    scope = link_keys.link_scope("key", None)

    def hashed(messages: list[dict[str, Any]]) -> list[str]:
        keys: list[str] = []
        for message in messages:
            keys.append(link_keys.extend_key(keys[-1] if keys else scope, message))
        return keys

    pad = "x" * 200
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "s" * 5000},
        {"role": "user", "content": pad + "A" + pad},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": pad + "B" + pad, "tool_call_id": "t1"},
        {"role": "user", "content": [{"type": "text", "text": "parts"}], "name": "n"},
    ]
    twin = [*history[:1], {"role": "user", "content": pad + "Z" + pad}, *history[2:]]  # same length and ends
    for messages in (history, twin, history, [*history, {"role": "assistant", "content": "a"}], twin):
        assert prefix_keys(messages, scope) == hashed(messages)
    assert prefix_keys(history, scope)[1] != prefix_keys(twin, scope)[1]
    monkeypatch.setattr(link_keys, "MEMO_BYTES", 6000)  # room for the long text and little else
    for messages in (history, twin, history):
        assert prefix_keys(messages, scope) == hashed(messages)
    assert link_keys._memo_bytes <= 6000 + 5200  # the newest entry may pass it until the next is added
    reply = {"role": "assistant", "content": "a1"}
    assert link_key(prefix_keys(history, scope)[-1], reply) == link_keys.extend_key(hashed(history)[-1], reply)


def test_naming_sources() -> None:
    n = naming({"x-session-id": "s", "x-task-id": "t", "x-onthejob-tags": "eval, a"}, {}, None)
    assert (n.session_id, n.task_id, n.tags, n.source) == ("s", "t", ("eval", "a"), "header")
    n = naming({}, {"metadata": {"session_id": "m", "task_id": "t2", "tags": ["eval"]}}, "p")
    assert (n.session_id, n.task_id, n.tags, n.source) == ("m", "t2", ("eval",), "metadata")
    n = naming({}, {}, "p")
    assert (n.session_id, n.source) == ("p", "path")


def test_tool_call_arguments_link_whatever_their_whitespace() -> None:
    def turn(arguments: str) -> dict[str, object]:
        return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": arguments}}]}

    # As vLLM streams a guided call, as it returns one unstreamed, as a client resends a parsed one.
    streamed, returned, resent = turn('{\n    "x": "é"\n}'), turn('{"x": "é"}'), turn('{"x":"é"}')
    assert prefix_keys([streamed]) == prefix_keys([returned]) == prefix_keys([resent])
    assert prefix_keys([turn('{"x": 1}')]) != prefix_keys([turn('{"x": 2}')])
    assert prefix_keys([turn("not json {")]) == prefix_keys([turn("not json {")])


FEW_SHOT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},  # an example no recorded call returned
    {"role": "user", "content": "Capital of Peru?"},
]


@pytest.mark.anyio
async def test_a_prefix_the_database_has_no_parent_for_is_asked_about_once_per_few_seconds(
    pg_url: str, tmp_path: Path
) -> None:
    """Few-shot examples (or a history from elsewhere) look like assistant turns to linking: without
    the miss remembered, every such call queried the database for a parent nobody recorded."""
    project = f"p-{uuid.uuid4().hex[:8]}"
    engine = async_engine(pg_url)
    spool = Spool(tmp_path / "spool", 10**9)
    # One host here (no wait for another host's parent: tests/proxy/test_two_hosts.py has that).
    linker = Linker(spool, async_sessionmaker(engine, expire_on_commit=False), miss_ttl_s=0.5, wait_s=0.0)
    unnamed, named = Naming(None, None, (), None, "new"), Naming("ses_named", None, (), None, "header")
    keys = prefix_keys(FEW_SHOT)
    try:
        first, again = [await linker.resolve(project, unnamed, FEW_SHOT, keys) for _ in range(2)]
        assert (first.source, again.source) == ("new", "new") and first.id != again.id
        assert linker.db_lookups == 1  # the second call believed the first's answer
        await linker.resolve(project, named, FEW_SHOT, keys)  # a named session asks for its own parent
        assert linker.db_lookups == 2

        # Another host records a call whose reply was that example: within the few seconds it is not
        # seen (the documented cost), after them it is.
        with Session(sync_engine(pg_url)) as db:
            db.merge(Project(id=project, settings={}))
            parent = record(1, session="ses_parent", project_id=project, link_key=keys[2], task_id="t9")
            db.execute(insert(Completion).values(parent.row()))
            db.commit()
        assert (await linker.resolve(project, unnamed, FEW_SHOT, keys)).source == "new"
        assert linker.db_lookups == 2
        await asyncio.sleep(0.6)
        linked = await linker.resolve(project, unnamed, FEW_SHOT, keys)
        assert (linked.id, linked.source, linked.parent_id, linked.task_id) == ("ses_parent", "linked", parent.id, "t9")
        assert linker.db_lookups == 3
        # A found parent is not remembered as a miss: the next call asks again (and finds it again).
        assert (await linker.resolve(project, unnamed, FEW_SHOT, keys)).id == "ses_parent"
        assert linker.db_lookups == 4
        assert linker.lookups == {"none": 2, "believed_none": 2, "database": 2}
    finally:
        spool.close()
        await engine.dispose()


@pytest.mark.anyio
async def test_a_database_that_does_not_answer_is_left_alone_a_few_seconds(tmp_path: Path) -> None:
    """Behind a partition a connect hangs: one call waits out its lookups (a second each, retried while it may
    wait for another host's parent), the next ones link from memory and spools alone until the quiet seconds
    pass; then the database is asked again."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections (its backlog) and never answers
    port = silent.getsockname()[1]
    engine = async_engine(f"postgresql://postgres@127.0.0.1:{port}/nothing")
    spool = Spool(tmp_path / "spool", 10**9)
    linker = Linker(spool, async_sessionmaker(engine, expire_on_commit=False), quiet_s=0.5)
    unnamed = Naming(None, None, (), None, "new")
    try:
        for _ in range(3):
            assert (await linker.resolve("p", unnamed, FEW_SHOT, prefix_keys(FEW_SHOT))).source == "new"
        assert linker.db_lookups == 1
        await asyncio.sleep(0.6)
        await linker.resolve("p", unnamed, FEW_SHOT, prefix_keys(FEW_SHOT))
        assert linker.db_lookups == 2
        assert linker.lookups == {"database_down": 2, "database_quiet": 2}
    finally:
        spool.close()
        silent.close()
        await engine.dispose()
