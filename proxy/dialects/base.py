"""Dialects: the other APIs harnesses speak, served through the one chat completions path.

A harness may speak OpenAI chat completions (native), the OpenAI Responses API or the
Anthropic Messages API. Each non-native API is a *dialect*: a thin adapter at the edge.
Its request is translated into an engine chat completions body, which then takes exactly
the path a chat call takes (routing, session linking, capture fields forced on, one spool
record, one trajectory builder); the engine's reply, or each stream chunk as it arrives,
is translated back into the dialect's own shape. Nothing is buffered: one engine chunk
becomes zero or more dialect events before the next chunk is read, and only the terminal
event waits for the record's fsync (as ``[DONE]`` does for chat).

Why not forward to vLLM's own ``/v1/responses`` or ``/v1/messages``? They return no token
ids, and the capture contract needs them; one capture path also means one place to get
streamed ids right (PRIOR_ART.md, Dialects). Those routes stay the reference in tests.

The record of a dialect call keeps both forms: ``request``, ``response`` and ``choices``
are the engine-facing chat call (what linking, trajectories, rewards and exports read);
``client_request`` and ``client_response`` are what the harness sent and received, and
``dialect`` names the API (``chat`` and ``completions`` for the native routes).

How a dialect plugs in
----------------------
1. Subclass :class:`Dialect` in ``proxy/dialects/<name>.py`` and set ``name`` (stored in
   the record's ``dialect`` column; ``GET /v1/chat/completions?dialect=<name>`` filters on
   it), ``paths`` (the POST routes it serves; each is also served under ``/s/{session}/``)
   and ``id_prefix`` (our completion id is ``id_prefix`` + 32 hex digits; it is also the
   id the client sees, and ``x-request-id``).
2. ``to_chat(body, previous)``: check the client's body and return the chat completions
   body for the engine, *without* capture fields (the serving path forces those on).
   Raise :class:`proxy.errors.InvalidRequest` with ``param`` naming the field for
   anything malformed or unsupported-and-answer-changing; ignore the rest.
3. ``reply(chat, ex)``: the engine's non-streamed chat reply (capture fields still in
   it: never copy ``token_ids``, ``prompt_token_ids`` or ``logprobs`` unless the client
   asked) → the client's body. The serving path calls ``reply_json`` (which serialises
   it; a dialect may write the bytes itself): the bytes are sent and recorded as they
   are, and parsed back only for a project whose redaction policy walks them.
4. ``stream(ex)``: a fresh :class:`DialectStream` per call (a state machine): ``open()``
   returns the bytes sent as soon as the engine accepted the call, ``feed(chunk)`` the
   bytes for one engine chunk, ``close(end)`` the terminal event(s); ``result`` is the
   client's body the stream added up to (stored as ``client_response``, serialised by
   ``result_bytes()`` unless ``close`` left its bytes in ``result_json``); ``ping()``, if
   the dialect has one, is sent when the engine stays silent for a while.
5. ``error(exc)``: ``(status, body)`` of an :class:`proxy.errors.ApiError` in the
   dialect's error shape. Every failure of a dialect route goes through it, including
   the engine's own 4xx (see :func:`engine_error`).
6. Optional: ``previous_id(body)`` names a stored call this one continues (the Responses
   API's ``previous_response_id``): the serving path finds it (memory, sibling spools,
   database), checks its project, passes it to ``to_chat`` as ``previous``, and the call
   joins its session with it as parent. ``credentials(headers)`` reads the API key
   (Anthropic's ``x-api-key``, say); the default reads ``Authorization``.
7. Register an instance in ``DIALECTS`` (``proxy/dialects/__init__.py``).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import orjson

from proxy.errors import ApiError, InvalidRequest, NotFound, RateLimited, Unauthorized, UpstreamError
from storage.records import dump_json


class Exchange(NamedTuple):
    """What translating a reply back needs to know about its call (a tuple: built once per call, cheaply)."""

    id: str  # our completion id: the client-facing id of the response/message
    model: str  # the alias the client named (never the served adapter's name)
    created: int  # unix seconds
    request: dict[str, Any]  # the client's own request body
    chat: dict[str, Any]  # the engine-facing chat body made from it (no capture fields)


@dataclass(frozen=True)
class StreamEnd:
    """How an engine stream ended: ``termination`` as recorded, the chat usage, the error if it failed."""

    termination: str  # stop | length | tool_calls | timeout | upstream_error
    usage: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Stored:
    """A stored call another call continues (``previous_id``), as the spool or the database holds it."""

    id: str
    project_id: str
    session_id: str
    task_id: str | None
    dialect: str
    status_code: int
    request: dict[str, Any]  # the engine-facing chat request
    choices: list[dict[str, Any]]  # captured choices: {"message", "token_ids", ...}
    client_request: dict[str, Any] | None
    client_response: dict[str, Any] | None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Stored:
        """From a completion record (spool) or a row's columns (database) as a dict."""
        return cls(
            id=record["id"],
            project_id=record["project_id"],
            session_id=record["session_id"],
            task_id=record.get("task_id"),
            dialect=record.get("dialect") or "chat",
            status_code=int(record.get("status_code") or 0),
            request=record.get("request") or {},
            choices=record.get("choices") or [],
            client_request=record.get("client_request"),
            client_response=record.get("client_response"),
        )


class DialectStream(ABC):
    """Translates one engine stream, chunk by chunk, into the dialect's events."""

    # ``result`` as serialised, when ``close`` serialised it anyway (a terminal event carrying the whole
    # body): the record reuses these bytes instead of serialising the body a second time.
    result_json: bytes | None = None

    @abstractmethod
    def open(self) -> bytes:
        """Events sent as soon as the engine accepted the call (before its first chunk)."""

    @abstractmethod
    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Events for one engine chat chunk (capture fields still in it); may be empty."""

    @abstractmethod
    def close(self, end: StreamEnd) -> bytes:
        """The terminal event(s); afterwards ``result`` holds the client's whole body."""

    @property
    @abstractmethod
    def result(self) -> dict[str, Any] | None:
        """The client's body the stream added up to (None before ``close``)."""

    def result_bytes(self) -> bytes | None:
        """:attr:`result` serialised, as its record stores it (None before ``close``)."""
        if self.result_json is not None:
            return self.result_json
        result = self.result
        return None if result is None else dump_json(result)

    def fail(self, exc: ApiError) -> bytes:
        """The event for a call that cannot end normally (the spool refused its record, say).

        Empty: the serving path sends ``error`` with the dialect's error body (Anthropic's shape)."""
        return b""

    def ping(self) -> bytes:
        """A keep-alive event for a long engine silence (Anthropic's ``ping``); empty: none."""
        return b""


class Dialect(ABC):
    """One client API translated at the edge; see the module docstring for how to add one."""

    name: ClassVar[str]
    paths: ClassVar[tuple[str, ...]]
    id_prefix: ClassVar[str]
    # Seconds of engine silence after which a stream sends its ``ping()`` (None: never).
    ping_interval_s: float | None = None
    previous_param: ClassVar[str | None] = None  # the request field ``previous_id`` reads (named in errors)

    def new_id(self) -> str:
        """Our completion id for a call of this dialect (128 random bits)."""
        return self.id_prefix + os.urandom(16).hex()

    def previous_id(self, body: dict[str, Any]) -> str | None:
        """The id of a stored call this request continues, if the dialect has such a field."""
        return None

    def credentials(self, headers: dict[str, str]) -> str | None:
        """The ``Authorization`` value to authenticate with (headers lower-cased)."""
        return headers.get("authorization")

    def stream_requested(self, body: dict[str, Any]) -> bool:
        """Whether the client asked for a stream (checked before translation)."""
        value = body.get("stream", False)
        if not isinstance(value, bool):
            raise InvalidRequest("'stream' must be true or false", param="stream")
        return value

    @abstractmethod
    def to_chat(self, body: dict[str, Any], previous: Stored | None) -> dict[str, Any]:
        """The engine-facing chat completions body (no capture fields)."""

    @abstractmethod
    def reply(self, chat: dict[str, Any], ex: Exchange) -> dict[str, Any]:
        """The client's body for the engine's non-streamed chat reply."""

    def reply_json(self, chat: dict[str, Any], ex: Exchange) -> bytes:
        """:meth:`reply` serialised: the bytes sent, and the record's ``client_response`` unless redacted."""
        return dump_json(self.reply(chat, ex))

    @abstractmethod
    def stream(self, ex: Exchange) -> DialectStream:
        """A fresh per-call stream translator."""

    @abstractmethod
    def error(self, exc: ApiError) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of one of our errors in this dialect's shape."""


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with an ``event:`` line (both Responses and Messages name theirs)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


ENGINE_ERRORS: dict[int, type[ApiError]] = {401: Unauthorized, 404: NotFound, 429: RateLimited}


def engine_error(status: int, raw: bytes) -> ApiError:
    """The engine's own 4xx/5xx answer (OpenAI's envelope, usually) as one of our errors.

    The engine refuses what it cannot serve (a tool schema it cannot compile, a prompt over
    the context length); a dialect client must get that in its own shape, with the field named.
    """
    message, param = raw.decode(errors="replace")[:2000], None
    try:
        body = orjson.loads(raw)
        detail = body.get("error", body) if isinstance(body, dict) else {}
        if isinstance(detail, dict):
            message = str(detail.get("message") or message)
            param = detail.get("param") if isinstance(detail.get("param"), str) else None
    except orjson.JSONDecodeError:
        pass
    if status >= 500:
        return UpstreamError(f"the engine failed with HTTP {status}: {message}")
    kind = ENGINE_ERRORS.get(status, InvalidRequest)
    return kind(f"the engine refused the request: {message}", param=param, code="engine_rejected")
