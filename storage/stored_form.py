"""How a call's two big columns are stored: in full, or as its parent plus what is new.

A coding agent's session resends its whole history every call, so storing each call's
``request`` and ``prompt_token_ids`` whole grows with turns². In the *delta form* a call
linked to a parent the recorder has already committed stores only what is new:

- ``request``: the messages beyond the parent's, every other key whose value differs from the
  parent's, and a reference under :data:`MARK`::

      {"messages": [<new ones>], "temperature": 0.2, "__stored__": {"parent": "<id>",
       "messages": <how many the parent's give>, "same": ["tools", ...], "order": [<the keys>],
       "ids": <how many prompt ids the parent's give, or null>}}

- ``prompt_token_ids``: the ids beyond the first ``ids`` of the parent's (``ids`` null: stored whole).

The first call of a session, a call whose parent's messages are not a prefix of its own, and
every :data:`CHECKPOINT`-th call of a chain are stored in full (reading one call touches at
most :data:`CHECKPOINT` rows). Rows stored before the delta form, and every full row, carry no
:data:`MARK` and are read as they are.

Every reader gets rows in full: ORM ``Completion`` rows through the load event :func:`on_load`
(installed by storage/models/record.py), column reads through :func:`expand_requests`, anything
else through :func:`expand_pairs`. The result is the full form: the result is the full form, equal to what the full
form stores, key order included (the columns are plain JSON: text as written). The delta form is written only with
``ONTHEJOB_STORED_FORM=delta`` (default ``full``) while the readers are brought over.

Deleting: a session delete (storage/deletion.py) takes a session's calls together, so a chain never
loses a link to it. Retention takes calls by age, a live session's oldest among them: before a batch
goes, each kept call stored as a delta of one of them is rewritten in full
(:func:`rewrite_children_in_full`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from storage.records import CallRecord, dump_json

MARK = "__stored__"
CHECKPOINT = 16  # every 16th call of a chain is stored in full
_BIG = 256  # a key other than messages is referenced to the parent's when its JSON is at least this long

Pair = tuple[Any, Any]  # (request, prompt_token_ids) as stored or as expanded


def delta_enabled() -> bool:
    return os.environ.get("ONTHEJOB_STORED_FORM", "full") == "delta"


@dataclass(slots=True)
class _Full:
    request: dict[str, Any]
    ids: bytes  # the prompt ids' JSON text, as recorded
    depth: int  # rows behind this one to its checkpoint


class Encoder:
    """The recorder's memory of the full form of calls it committed recently, to store children as deltas."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._recent: OrderedDict[str, _Full] = OrderedDict()
        self._pending: dict[str, _Full] = {}

    def encode(self, records: Sequence[CallRecord]) -> list[CallRecord]:
        """The records as they are inserted (in one transaction): copies in the delta form where the
        parent is committed or earlier in ``records``. :meth:`committed` once the batch is in."""
        self._pending = {}
        return [self._encode(r) for r in records]

    def committed(self) -> None:
        """The last :meth:`encode`'s records are in the database: remember them as parents."""
        for call_id, full in self._pending.items():
            self._recent[call_id] = full
            self._recent.move_to_end(call_id)
        self._pending = {}
        while len(self._recent) > self.size:
            self._recent.popitem(last=False)

    def _encode(self, r: CallRecord) -> CallRecord:
        if r.request[:1] != b"{" or r.dialect != "chat":
            return r  # other dialects are read by id as columns (proxy/dialects/lookup.py): kept whole
        request = orjson.loads(r.request)
        parent = (self._pending.get(r.parent_id) or self._recent.get(r.parent_id)) if r.parent_id else None
        stored = None
        if parent is not None and parent.depth + 1 < CHECKPOINT:
            stored = _delta_of(request, r.prompt_token_ids, parent)
        self._pending[r.id] = _Full(request, r.prompt_token_ids, 0 if stored is None or parent is None
                                    else parent.depth + 1)  # fmt: skip
        if stored is None:
            return r
        stored_request, stored_ids = stored
        stored_request[MARK]["parent"] = r.parent_id
        return replace(r, request=dump_json(stored_request), prompt_token_ids=stored_ids)


def _ids_suffix(ids: bytes, before: bytes) -> tuple[int, bytes] | None:
    """(how many ids ``before`` holds, the JSON of the ids after them) when the list ``ids`` starts
    with the list ``before`` (both JSON text as orjson writes it: compared as bytes, never parsed)."""
    if before[:1] != b"[" or ids[:1] != b"[" or len(before) < 3:
        return None  # null, or an empty list: nothing to share
    head = before[:-1]  # "[1,2,3"
    if not ids.startswith(head):
        return None
    after = ids[len(head) : len(head) + 1]
    if after == b"]":
        return head.count(b",") + 1, b"[]"
    if after == b",":
        return head.count(b",") + 1, b"[" + ids[len(head) + 1 :]
    return None  # "[1,2,3" then a digit: 33 is not 3


def _delta_of(request: Any, ids: bytes, parent: _Full) -> tuple[dict[str, Any], bytes] | None:
    """(stored request, stored ids' JSON) of ``request``/``ids`` against ``parent``, or None: in full."""
    if not isinstance(request, dict) or MARK in request:
        return None
    messages, before = request.get("messages"), parent.request.get("messages")
    if not isinstance(messages, list) or not isinstance(before, list) or messages[: len(before)] != before:
        return None
    suffix = _ids_suffix(ids, parent.ids)
    n_ids = suffix[0] if suffix is not None else None
    out: dict[str, Any] = {}
    same = []
    for key, value in request.items():
        if key == "messages":
            out[key] = messages[len(before) :]
        elif key in parent.request and parent.request[key] == value and len(dump_json(value)) >= _BIG:
            same.append(key)
        else:
            out[key] = value
    out[MARK] = {"parent": None, "messages": len(before), "same": same, "order": list(request), "ids": n_ids}
    return out, (suffix[1] if suffix is not None else ids)


def is_delta(request: Any) -> bool:
    return isinstance(request, dict) and MARK in request


def expand_one(stored: Pair, parent_full: Pair) -> Pair:
    """A delta row's (request, ids) in full, given its parent's in full."""
    request, ids = stored
    mark = request[MARK]
    before_request, before_ids = parent_full
    full: dict[str, Any] = {}
    for key in mark["order"]:
        if key == "messages":
            full[key] = list(before_request["messages"][: mark["messages"]]) + list(request["messages"])
        elif key in mark["same"]:
            full[key] = before_request[key]
        else:
            full[key] = request[key]
    if mark["ids"] is not None:
        ids = list(before_ids[: mark["ids"]]) + list(ids or [])
    return full, ids


def _parents(rows: Iterable[Pair]) -> set[str]:
    return {r[MARK]["parent"] for r, _ in rows if is_delta(r)}


def _resolve(stored: dict[str, Pair], known: dict[str, Pair]) -> dict[str, Pair]:
    """Every row of ``stored`` in full, its chains' rows all in ``known``."""
    full: dict[str, Pair] = {}

    def resolve(call_id: str) -> Pair:
        chain = []
        while call_id not in full and is_delta(known[call_id][0]):
            chain.append(call_id)
            call_id = known[call_id][0][MARK]["parent"]
        if call_id not in full:
            full[call_id] = known[call_id]
        for child in reversed(chain):
            full[child] = expand_one(known[child], full[call_id])
            call_id = child
        return full[call_id]

    return {i: resolve(i) for i in stored}


def _check(todo: set[str], got: dict[str, Pair]) -> None:
    missing = todo - got.keys()
    if missing:
        raise LookupError(f"stored form: parent rows {sorted(missing)[:3]} are gone")


async def expand_pairs(
    stored: dict[str, Pair], fetch: Callable[[list[str]], Awaitable[dict[str, Pair]]]
) -> dict[str, Pair]:
    """Every row of ``stored`` (id → stored (request, ids)) in full; ``fetch`` reads more rows by id."""
    known = dict(stored)
    todo = _parents(known.values()) - known.keys()
    while todo:
        got = await fetch(sorted(todo))
        _check(todo, got)
        known.update(got)
        todo = _parents(got.values()) - known.keys()
    return _resolve(stored, known)


def expand_pairs_sync(stored: dict[str, Pair], fetch: Callable[[list[str]], dict[str, Pair]]) -> dict[str, Pair]:
    """:func:`expand_pairs` with a blocking ``fetch``."""
    known = dict(stored)
    todo = _parents(known.values()) - known.keys()
    while todo:
        got = fetch(sorted(todo))
        _check(todo, got)
        known.update(got)
        todo = _parents(got.values()) - known.keys()
    return _resolve(stored, known)


def _fetch_with(conn: Any) -> Callable[[list[str]], dict[str, Pair]]:
    """Rows by id through a SQLAlchemy connection (Core: no ORM events, no autoflush)."""
    from sqlalchemy import select

    from storage.models import Completion

    t = Completion.__table__.c

    def fetch(ids: list[str]) -> dict[str, Pair]:
        rows = conn.execute(select(t.id, t.request, t.prompt_token_ids).where(t.id.in_(ids))).all()
        return {row[0]: (row[1], row[2]) for row in rows}

    return fetch


def on_load(target: Any, context: Any, attrs: Any = None) -> None:
    """The ORM's load (and refresh) event of ``Completion``: a delta row arrives in full, as loaded
    (never written back). Runs inside the session's connection, async sessions included."""
    state = target.__dict__
    request = state.get("request")
    if not is_delta(request):
        return
    from sqlalchemy.orm.attributes import set_committed_value

    conn = context.session.connection()
    pair = expand_pairs_sync({target.id: (request, state.get("prompt_token_ids"))}, _fetch_with(conn))[target.id]
    set_committed_value(target, "request", pair[0])
    set_committed_value(target, "prompt_token_ids", pair[1])


def expand_requests(conn: Any, rows: dict[str, Any]) -> dict[str, Any]:
    """Column reads (id → stored request) in full: the requests only (storage/mine_store.py)."""
    deltas = {i: (r, None) for i, r in rows.items() if is_delta(r)}
    if not deltas:
        return rows
    full = expand_pairs_sync(deltas, _fetch_with(conn))
    return {i: full[i][0] if i in full else r for i, r in rows.items()}


def full_columns_sync(conn: Any, call_id: str) -> dict[str, str]:
    """One call's ``request`` and ``prompt_token_ids`` JSON text in full, through a psycopg connection
    (bench/long_sessions.py sizes today's form of a row with it)."""
    import asyncio

    def fetch_now(ids: list[str]) -> dict[str, Pair]:
        rows = conn.execute("SELECT id, request, prompt_token_ids FROM completions WHERE id = ANY(%s)", (ids,))
        return {r[0]: (r[1], r[2]) for r in rows.fetchall()}

    async def fetch(ids: list[str]) -> dict[str, Pair]:
        return fetch_now(ids)

    request, ids = asyncio.run(expand_pairs(fetch_now([call_id]), fetch))[call_id]
    return {"request": dump_json(request).decode(), "prompt_token_ids": dump_json(ids).decode()}


def rewrite_children_in_full(db: Any, project: str, doomed: list[str]) -> int:
    """Before ``doomed`` calls are deleted (retention, storage/retention.py): every kept call stored as
    a delta of one of them is rewritten in full, so no chain loses a link. A kept call further down
    only references kept calls, so the direct children are all. How many were rewritten."""
    from sqlalchemy import select, update

    from storage.models import Completion

    t = Completion.__table__.c
    conn = db.connection()
    rows = conn.execute(select(t.id, t.request, t.prompt_token_ids).where(
        t.project_id == project, t.parent_id.in_(doomed), t.id.not_in(doomed))).all()  # fmt: skip
    deltas = {r[0]: (r[1], r[2]) for r in rows if is_delta(r[1])}
    if not deltas:
        return 0
    for call_id, (request, ids) in expand_pairs_sync(deltas, _fetch_with(conn)).items():
        conn.execute(update(Completion).where(Completion.id == call_id).values(request=request, prompt_token_ids=ids))
    return len(deltas)
