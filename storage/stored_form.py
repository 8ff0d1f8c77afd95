"""How a call's two big columns are stored: in full, or as its parent plus what is new.

A coding agent's session resends its whole history every call, so storing each call's
``request`` and ``prompt_token_ids`` whole grows with turns². In the *delta form* a call
linked to a parent the recorder has already committed stores only what is new:

- ``request``: a reference under :data:`MARK` (its first key), the messages beyond the parent's,
  and every other key whose value differs from the parent's::

      {"__stored__": {"parent": "<id>", "messages": <how many the parent's give>, "same": ["tools", ...],
       "order": [<the keys>], "ids": <how many prompt ids the parent's give, or null>},
       "messages": [<new ones>], "temperature": 0.2}

- ``prompt_token_ids``: the ids beyond the first ``ids`` of the parent's (``ids`` null: stored whole).

A call that begins a chain (a session's first call, a call whose history does not extend its
parent's, every :data:`CHECKPOINT`-th call of a chain) has no parent to refer to; its leading
system messages and its large keys (a harness's system prompt and tool list, the same in every
session of a project) are stored once per project in ``stored_prefixes`` (content-addressed: the
sha256 of their JSON, with a count of the rows referencing them) and the row references them
(``{"__stored__": {"prefix": "<sha256>", ...}}``, the same fields). Prompt ids are not shared.

Reading a call touches its chain back to the row that begins it: one recursive query for any
number of calls (``stored_read.Rows``), plus one for the prefixes; rows of one ORM query share what
was expanded, so loading a session in order reads each row once. Rows stored before the delta
form, and every row in full, carry no :data:`MARK` and are read as they are.

Every reader gets rows in full (storage/stored_read.py): ORM ``Completion`` rows through the load
event ``on_load`` (installed by storage/models/record.py), column reads through ``expand_requests``. The result
is equal to what the full form stores, key order included (the columns are plain JSON: text as
written). The delta form is the default; ``ONTHEJOB_STORED_FORM=full`` writes every row in full (reads
are the same either way, and a database may hold rows of both forms).

Deleting: a session delete (storage/deletion.py) takes a session's calls together, so a chain never
loses a link to it; it releases their prefix references (``release_prefixes``). Retention takes
calls by age, a live session's oldest among them: before a batch goes, each kept call stored as a
delta of one of them is rewritten in full (``rewrite_children_in_full``), and the batch's
prefix references are released.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from storage.records import CallRecord, dump_json

log = logging.getLogger("onthejob.stored_form")
MARK = "__stored__"
# Reading one call touches at most this many rows (one query whatever the count). Sessions are 50-300
# calls: a checkpoint costs the call's whole history again, so they are rare.
CHECKPOINT = 256
_BIG = 256  # a key other than messages is referenced to the parent's when its JSON is at least this long
PREFIX_MIN = 1024  # a chain's first row references a shared prefix when that prefix is at least this long
_LEADING = ("system", "developer")  # the roles of the messages a shared prefix holds
# How a delta's text begins (orjson writes it so): the recursive query follows only these rows' parents.
DELTA_HEAD = '{"' + MARK + '":{"parent":'
_PREFIX_REF = re.compile(rb'"prefix":\s*"([0-9a-f]{64})"')

Pair = tuple[Any, Any]  # (request, prompt_token_ids) as stored or as expanded
Prefixes = dict[tuple[str, str], tuple[bytes, int]]  # (project, hash) → (body's JSON, references added)


def delta_enabled() -> bool:
    return os.environ.get("ONTHEJOB_STORED_FORM", "delta") != "full"


@dataclass(slots=True)
class _Full:
    request: dict[str, Any]
    ids: bytes  # the prompt ids' JSON text, as recorded
    depth: int  # rows behind this one to the row that begins its chain


class Encoder:
    """The recorder's memory of the full form of calls it committed recently, to store children as deltas."""

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self._recent: OrderedDict[str, _Full] = OrderedDict()
        self._pending: dict[str, _Full] = {}
        self._refs: dict[str, tuple[str, str, bytes]] = {}  # call id → (project, prefix hash, its body)
        self._parent_of: dict[str, str] = {}  # call id → the row its delta refers to (the last encode's)
        self._given: dict[str, CallRecord] = {}  # call id → the record as the last encode was given it

    def encode(self, records: Sequence[CallRecord]) -> list[CallRecord]:
        """The records as they are inserted (in one transaction): copies in the delta form where the
        parent is committed or earlier in ``records``. :meth:`committed` once the batch is in."""
        self._pending, self._refs, self._parent_of = {}, {}, {}
        self._given = {r.id: r for r in records}
        return [self._encode_or_whole(r) for r in records]

    def _encode_or_whole(self, r: CallRecord) -> CallRecord:
        """:meth:`_encode`, or the record as it is should encoding fail: the delta form saves space, and a
        failure of it must never cost a record (the recorder would quarantine it as poison)."""
        try:
            return self._encode(r)
        except Exception:  # noqa: BLE001 - logged with its traceback; the row goes in full
            log.exception("stored form: call %s not encoded; stored in full", r.id)
            self._pending.pop(r.id, None)
            self._refs.pop(r.id, None)
            self._parent_of.pop(r.id, None)
            return r

    def prefixes(self, inserted: Iterable[CallRecord]) -> Prefixes:
        """The shared prefixes the ``inserted`` rows (of the last :meth:`encode`) reference, with their counts."""
        out: Prefixes = {}
        for r in inserted:
            ref = self._refs.get(r.id)
            if ref is not None:
                body, n = out.get(ref[:2], (ref[2], 0))
                out[ref[:2]] = (body, n + 1)
        return out

    def outside_parents(self, rows: Sequence[CallRecord]) -> list[str]:
        """The parents the delta rows among ``rows`` refer to that are not themselves among ``rows``: rows
        this recorder committed earlier, which a delete or retention pass may have taken since."""
        inside = {r.id for r in rows}
        return sorted({p for r in rows if (p := self._parent_of.get(r.id)) is not None and p not in inside})

    def settle(self, rows: Sequence[CallRecord], present: set[str]) -> list[CallRecord]:
        """``rows`` as inserted: a delta row whose parent is neither in ``present`` (outside parents that
        still exist, read in the inserting transaction) nor among ``rows`` goes in full (the record as
        :meth:`encode` was given it), and no longer counts a prefix reference.

        The parent's session was deleted, or retention took it, after this recorder committed it (a call
        the link cache still continued), or it was dropped from this very batch as made before its
        session's delete: a delta of it could not be read back."""
        inside = {r.id for r in rows}
        out = []
        for r in rows:
            parent = self._parent_of.get(r.id)
            if parent is not None and parent not in inside and parent not in present:
                r = self._given[r.id]
                self._refs.pop(r.id, None)
                self._parent_of.pop(r.id, None)
                if (full := self._pending.get(r.id)) is not None:
                    full.depth = 0  # in full: its children's chains begin here
            out.append(r)
        return out

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
        if r.parent_id is None and len(r.request) < PREFIX_MIN:
            # Nothing to refer to and too short to hold a shared prefix: not parsed (most single calls). Not
            # remembered either: a child of it begins its own chain, one short row more a session.
            return r
        request = r.parsed_request if r.parsed_request is not None else orjson.loads(r.request)
        if not isinstance(request, dict) or MARK in request:
            return r
        parent = (self._pending.get(r.parent_id) or self._recent.get(r.parent_id)) if r.parent_id else None
        stored = None
        if parent is not None and parent.depth + 1 < CHECKPOINT:
            stored = _delta_of(request, r.prompt_token_ids, parent.request, parent.ids)
        self._pending[r.id] = _Full(
            request, r.prompt_token_ids, 0 if stored is None or parent is None else parent.depth + 1
        )
        if stored is not None:
            stored_request, stored_ids = stored
            stored_request[MARK] = {"parent": r.parent_id, **stored_request[MARK]}
            self._parent_of[r.id] = r.parent_id  # type: ignore[assignment]  # a parent was found by it
            return replace(r, request=dump_json(stored_request), prompt_token_ids=stored_ids)
        prefix = _prefix_of(request)
        if prefix is None:
            return r
        digest, body, text = prefix
        stored = _delta_of(request, b"null", body, b"null")
        if stored is None:
            return r
        self._refs[r.id] = (r.project_id, digest, text)
        stored[0][MARK] = {"prefix": digest, **stored[0][MARK]}
        return replace(r, request=dump_json(stored[0]))


def _prefix_of(request: dict[str, Any]) -> tuple[str, dict[str, Any], bytes] | None:
    """(sha256, body, body's JSON) of the part of ``request`` a project's sessions share: its leading
    system messages and its large keys other than messages; None when that is short."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    n = 0
    while n < len(messages) and isinstance(messages[n], dict) and messages[n].get("role") in _LEADING:
        n += 1
    body: dict[str, Any] = {"messages": messages[:n]}
    for key, value in request.items():
        if key != "messages" and len(dump_json(value)) >= _BIG:
            body[key] = value
    text = dump_json(body)
    if len(text) < PREFIX_MIN:
        return None
    return hashlib.sha256(text).hexdigest(), body, text


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


def _delta_of(
    request: dict[str, Any], ids: bytes, base: dict[str, Any], base_ids: bytes
) -> tuple[dict[str, Any], bytes] | None:
    """(stored request, stored ids' JSON) of ``request``/``ids`` against ``base`` (a parent's full request,
    or a shared prefix), or None: in full. The request's :data:`MARK` comes first, without its reference."""
    messages, before = request.get("messages"), base.get("messages")
    if not isinstance(messages, list) or not isinstance(before, list) or messages[: len(before)] != before:
        return None
    suffix = _ids_suffix(ids, base_ids)
    same = []
    rest: dict[str, Any] = {}
    for key, value in request.items():
        if key == "messages":
            rest[key] = messages[len(before) :]
        elif key in base and base[key] == value and len(dump_json(value)) >= _BIG:
            same.append(key)
        else:
            rest[key] = value
    mark = {
        "messages": len(before),
        "same": same,
        "order": list(request),
        "ids": suffix[0] if suffix is not None else None,
    }
    return {MARK: mark, **rest}, (suffix[1] if suffix is not None else ids)


def is_delta(request: Any) -> bool:
    """Whether a stored request refers to another row or a shared prefix (reads must expand it)."""
    return isinstance(request, dict) and MARK in request


def expand_one(stored: Pair, base: Pair) -> Pair:
    """A stored row's (request, ids) in full, given its base's in full (its parent's, or a prefix's)."""
    request, ids = stored
    mark = request[MARK]
    before_request, before_ids = base
    full: dict[str, Any] = {}
    for key in mark["order"]:
        if key == "messages":
            full[key] = list(before_request["messages"][: mark["messages"]]) + list(request["messages"])
        elif key in mark["same"]:
            full[key] = before_request[key]
        else:
            full[key] = request[key]
    if mark["ids"] is not None and before_ids is not None:  # None: a read of requests alone
        ids = list(before_ids[: mark["ids"]]) + list(ids or [])
    return full, ids


# --------------------------------------------------------------------------- writing and deleting


ADD_PREFIXES_PG = """INSERT INTO stored_prefixes (project_id, hash, body, refs, created_at)
SELECT x.project_id, x.hash, x.body, x.refs, now()
  FROM json_to_recordset(%s::json) AS x(project_id text, hash text, body json, refs int)
ON CONFLICT (project_id, hash) DO UPDATE SET refs = stored_prefixes.refs + excluded.refs"""


async def add_prefixes_pg(conn: Any, prefixes: Prefixes) -> None:
    """Count the references of a batch's rows in the recorder's transaction (psycopg), inserting new prefixes."""
    if prefixes:
        rows = [
            {"project_id": p, "hash": h, "body": orjson.Fragment(body), "refs": n}
            for (p, h), (body, n) in sorted(prefixes.items())
        ]
        await conn.execute(ADD_PREFIXES_PG, [orjson.dumps(rows).decode()])


async def add_prefixes(db: Any, prefixes: Prefixes) -> None:
    """:func:`add_prefixes_pg` through an async SQLAlchemy session (any database)."""
    if not prefixes:
        return
    from storage.db import insert_for
    from storage.models import StoredPrefix, utcnow

    conn = await db.connection()
    table = StoredPrefix.__table__
    stmt = insert_for(conn.dialect.name)(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=["project_id", "hash"], set_={"refs": table.c.refs + stmt.excluded.refs}
    )
    now = utcnow()
    await conn.execute(
        stmt,
        [
            {"project_id": p, "hash": h, "body": orjson.loads(body), "refs": n, "created_at": now}
            for (p, h), (body, n) in sorted(prefixes.items())
        ],
    )
