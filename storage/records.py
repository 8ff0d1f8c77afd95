"""The record of one served call, as the proxy spools it and the recorder inserts it.

One definition (:class:`CallRecord`: the ``completions`` row of storage/models/record.py
plus how its session was found) with its three forms:

- the spool line (:meth:`CallRecord.encode`, :meth:`CallRecord.decode`), one JSON
  object per line, ``{"completion": {...}, "session": {...}}``;
- the COPY line (:meth:`CallRecord.copy_line`, Postgres);
- the SQLAlchemy row (:meth:`CallRecord.row`, any database).

Each JSON column is serialised once, when the call is recorded (:func:`dump_json`),
and that text is both embedded in the spool line (``orjson.Fragment``: copied, not
re-encoded) and written by COPY. Nothing is validated on the way: the proxy built
the record itself. Only a record read back from disk (after a restart, or a
sibling worker's) is parsed and re-serialised.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import orjson

Fragment = orjson.Fragment

# The completions columns holding JSON, serialised once into the record.
JSON_FIELDS = (
    "client_request",
    "client_response",
    "tags",
    "request",
    "response",
    "prompt_token_ids",
    "choices",
    "sampling",
    "usage",
)


def dump_json(value: Any) -> bytes:
    """A JSON column's text: orjson (NaN becomes null, which Postgres' json accepts)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # integers past 64 bits: the stdlib writes them exactly
        return json.dumps(value, default=str).encode()


@dataclass(slots=True)
class CallRecord:
    """One call: every ``completions`` column (JSON ones as serialised text), and its session's source."""

    id: str
    project_id: str
    session_id: str
    task_id: str | None
    client_request_id: str | None
    upstream_id: str | None
    endpoint: str
    dialect: str  # the API the client spoke (storage/models/record.py: Completion.dialect)
    client_request: bytes
    client_response: bytes
    alias: str
    served_model: str
    adapter_version: int | None
    tags: bytes
    request: bytes
    response: bytes
    prompt_token_ids: bytes
    choices: bytes
    sampling: bytes
    usage: bytes
    status_code: int
    termination: str
    error: str | None
    stream: bool
    link_key: str | None
    parent_id: str | None
    created_at: str  # ISO 8601 with its offset: COPY parses it as is
    latency_ms: float | None
    ttft_ms: float | None
    session_source: str  # how the session was found: header | metadata | path | linked | new
    adapter_sha256: str | None = None  # the content hash of the adapter version that served it
    end_user: str | None = None  # the caller the client named (storage/models/record.py: Completion.end_user)
    # ``request`` parsed, when the proxy has it as the dict those bytes parse to (never written to the spool):
    # the recorder's stored form reads it instead of parsing a long conversation's request again.
    parsed_request: Any = field(default=None, compare=False, repr=False)

    # ---- the spool line ------------------------------------------------------------
    def encode(self) -> bytes:
        """The spool line (without its newline)."""
        # Spelt out, not a loop over COLUMNS: this runs once per call on the event loop (a test
        # checks that it writes every column).
        tags = Fragment(self.tags)
        completion = {
            "link_key": self.link_key,
            "id": self.id,
            "project_id": self.project_id,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "client_request_id": self.client_request_id,
            "upstream_id": self.upstream_id,
            "endpoint": self.endpoint,
            "dialect": self.dialect,
            "client_request": Fragment(self.client_request),
            "client_response": Fragment(self.client_response),
            "alias": self.alias,
            "served_model": self.served_model,
            "adapter_version": self.adapter_version,
            "tags": tags,
            "request": Fragment(self.request),
            "response": Fragment(self.response),
            "prompt_token_ids": Fragment(self.prompt_token_ids),
            "choices": Fragment(self.choices),
            "sampling": Fragment(self.sampling),
            "usage": Fragment(self.usage),
            "status_code": self.status_code,
            "termination": self.termination,
            "error": self.error,
            "stream": self.stream,
            "parent_id": self.parent_id,
            "created_at": self.created_at,
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "adapter_sha256": self.adapter_sha256,
            "end_user": self.end_user,
        }
        session = {
            "project_id": self.project_id,
            "id": self.session_id,
            "task_id": self.task_id,
            "source": self.session_source,
            "tags": tags,
        }
        return orjson.dumps({"completion": completion, "session": session})

    @classmethod
    def decode(cls, line: bytes) -> CallRecord:
        """A spool line back into a record. Raises ValueError (or orjson's) for what is not one."""
        obj = orjson.loads(line)
        try:
            completion, session = obj["completion"], obj.get("session") or {}
            values = {name: completion.get(name) for name in COLUMNS}
            values["dialect"] = values["dialect"] or "chat"  # lines from before dialects
            for name in JSON_FIELDS:
                values[name] = dump_json(completion[name] if name in completion else _EMPTY[name])
            return cls(**values, session_source=session.get("source") or "header")
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a call record: {line[:200]!r}") from exc

    # ---- the database rows --------------------------------------------------------
    def copy_line(self) -> bytes:
        """The COPY text-format line (without its newline) of :data:`COLUMNS`, built here, not by psycopg.

        Each JSON column is the text serialised when the call was recorded, with its backslashes
        doubled (orjson writes no raw tab, newline or carriage return; those are escaped in its
        strings); the time is the ISO text, which COPY parses. Spelt out in :data:`COLUMNS` order, as
        :meth:`encode` is: this runs once per call, and psycopg's ``write_row`` over a tuple of the
        values cost twice as much (a test reads it back column by column).
        """
        return b"\t".join(
            (
                _text(self.id),
                _text(self.project_id),
                _text(self.session_id),
                _text(self.task_id),
                _text(self.client_request_id),
                _text(self.upstream_id),
                _text(self.endpoint),
                _text(self.dialect),
                _json(self.client_request),
                _json(self.client_response),
                _text(self.alias),
                _text(self.served_model),
                _number(self.adapter_version),
                _json(self.tags),
                _json(self.request),
                _json(self.response),
                _json(self.prompt_token_ids),
                _json(self.choices),
                _json(self.sampling),
                _json(self.usage),
                _number(self.status_code),
                _text(self.termination),
                _text(self.error),
                b"t" if self.stream else b"f",
                _text(self.link_key),
                _text(self.parent_id),
                _text(self.created_at),
                _number(self.latency_ms),
                _number(self.ttft_ms),
                _text(self.adapter_sha256),
                _text(self.end_user),
            )
        )

    def row(self) -> dict[str, Any]:
        """The completions row as SQLAlchemy inserts it (JSON parsed back, the time as a datetime)."""
        row = {name: getattr(self, name) for name in COLUMNS}
        for name in JSON_FIELDS:
            row[name] = orjson.loads(row[name])
        row["created_at"] = datetime.fromisoformat(self.created_at)
        return row

    def session_row(self) -> dict[str, Any]:
        """The sessions row this call creates or touches (tags parsed)."""
        return {
            "project_id": self.project_id,
            "id": self.session_id,
            "task_id": self.task_id,
            "source": self.session_source,
            "tags": orjson.loads(self.tags),
        }

    def session_json_row(self) -> dict[str, Any]:
        """:meth:`session_row` with its tags as the already-serialised JSON (for one orjson pass over a batch)."""
        return {
            "project_id": self.project_id,
            "id": self.session_id,
            "task_id": self.task_id,
            "source": self.session_source,
            "tags": Fragment(self.tags),
        }


# The completions columns, in the order of the record's fields.
COLUMNS = tuple(f.name for f in fields(CallRecord) if f.name not in ("session_source", "parsed_request"))
# What a JSON column holds when an older line lacks it (the ORM models' defaults).
_EMPTY: dict[str, Any] = {
    "tags": [],
    "request": {},
    "choices": [],
    "sampling": {},
    "prompt_token_ids": None,
    "usage": None,
    "response": None,
    "client_request": None,
    "client_response": None,
}


# COPY's text format: a backslash starts an escape; tab, newline and carriage return end a field or row.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _text(value: str | None) -> bytes:
    """A text column in COPY's text format (``\\N`` for NULL). A NUL is refused by the server, as it
    was through psycopg: that batch takes the portable path."""
    if value is None:
        return b"\\N"
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.translate(_COPY_ESCAPES)
    return value.encode()


def _json(value: bytes) -> bytes:
    return value.replace(b"\\", b"\\\\") if b"\\" in value else value


def _number(value: float | None) -> bytes:
    return b"\\N" if value is None else str(value).encode()


def end_user_key(user: str) -> str:
    """How an end-user id is stored: as given, or its hash when a column cannot hold it (over 200 characters, NUL)."""
    if len(user) <= 200 and "\x00" not in user:
        return user
    return "sha256:" + hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()
