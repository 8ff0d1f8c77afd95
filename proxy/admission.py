"""Admission: every value a call's record stores from the client is checked before the engine is called.

A 200 means recorded. An id longer than its column, a NUL (Postgres text cannot hold one) or
tags of the wrong type would be answered 200 and then fail at the recorder's COPY, leaving
the call quarantined: so each is refused here with a 400 (:class:`proxy.errors.InvalidRequest`)
naming the field, in the dialect's own error shape (the edge converts it once).

The limits are read off the storage columns (storage/models/record.py), so the two cannot
drift, and this is the one module that holds them: the edge calls :func:`check_call`
(proxy/handle.py), the Responses dialect :func:`call_id` (proxy/dialects/responses.py), and
the dataset routes import :data:`TAG_CHARS` and :data:`MAX_TAGS` for a filter's tags
(proxy/routes_datasets.py). What they are today (``python -m proxy.admission`` prints them):

============================  =====  ==========================================================
value                         limit  from
============================  =====  ==========================================================
``X-Client-Request-Id``       200    ``completions.client_request_id`` String(200)
session id (header, metadata, 200    ``completions.session_id`` and ``sessions.id`` String(200)
path)
task id (header, metadata)    200    ``completions.task_id`` and ``sessions.task_id`` String(200)
a named call id               64     ``completions.id`` String(64) (``previous_response_id``)
a tag                         200    no column (a JSON list); a dataset filter names a tag in at
                                     most as many characters (proxy/routes_datasets.py imports
                                     this), so every recorded tag can be selected
tags per call                 100    as many as one dataset filter may require (the same import)
end user                      none   stored as given up to ``completions.end_user`` String(200),
                                     past that (or with a NUL) as its sha256 (storage/records.py)
============================  =====  ==========================================================

Every id is text with no NUL character. In the body, ``metadata`` is an object; its
``session_id``, ``task_id``, ``user_id`` and ``end_user``, and ``user``, are strings (or
integers, recorded as their decimal text); ``tags`` is a comma-separated string or a list of
strings. The rest of the body is recorded as JSON as the client sent it (Postgres' json type
holds any document orjson parsed, NUL escapes included), bounded by the body limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import String
from sqlalchemy.sql.elements import KeyedColumnElement

from proxy.errors import InvalidRequest
from storage.models import Completion, Session


def _chars(*columns: KeyedColumnElement[Any]) -> int:
    """The fewest characters any of these text columns holds."""
    lengths = [c.type.length for c in columns if isinstance(c.type, String) and c.type.length]
    assert len(lengths) == len(columns), "every column named here has a length"
    return min(lengths)


CALLS, SESSIONS = Completion.__table__.c, Session.__table__.c
CLIENT_REQUEST_ID_CHARS = _chars(CALLS.client_request_id)
SESSION_ID_CHARS = _chars(CALLS.session_id, SESSIONS.id)
TASK_ID_CHARS = _chars(CALLS.task_id, SESSIONS.task_id)
CALL_ID_CHARS = _chars(CALLS.id)  # a stored call's id, as a dialect's ``previous_response_id`` names one
END_USER_CHARS = _chars(CALLS.end_user)  # stored as given up to this, hashed past it
TAG_CHARS = 200  # a tag; also a dataset filter's tag (proxy/routes_datasets.py Tag)
MAX_TAGS = 100  # tags per call; also per dataset filter (proxy/routes_datasets.py FilterIn.tags)


def text_id(field: str, value: str, limit: int) -> str:
    """``value`` if a text column of ``limit`` characters holds it; else a 400 naming ``field``."""
    if len(value) > limit:
        raise InvalidRequest(
            f"{field} is {len(value)} characters; at most {limit} are recorded: send a shorter id",
            param=field,
            code="invalid_value",
        )
    if "\x00" in value:
        raise InvalidRequest(
            f"{field} holds a NUL character, which cannot be recorded", param=field, code="invalid_value"
        )
    return value


def body_id(field: str, value: Any) -> str | None:
    """A body id as its text: a string, or an integer's decimal text (None for null); else a 400."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise InvalidRequest(f"{field} must be a string, not {_kind(value)}", param=field, code="invalid_type")


def client_request_id(value: str | None, field: str = "X-Client-Request-Id") -> None:
    """The client's own request id (``completions.client_request_id``)."""
    if value:
        text_id(field, value, CLIENT_REQUEST_ID_CHARS)


def call_id(value: Any, field: str) -> str:
    """The id of a stored call a request names (a dialect's ``previous_response_id``): text a call id can be."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field} must be a call id (a non-empty string)", param=field, code="invalid_type")
    return text_id(field, value, CALL_ID_CHARS)


def session_id(value: Any, field: str) -> None:
    """A session id named by a header, ``metadata.session_id`` or the ``/s/{id}/`` path."""
    text = body_id(field, value)
    if text:
        text_id(field, text, SESSION_ID_CHARS)


def task_id(value: Any, field: str) -> None:
    """A task id named by ``X-Task-Id`` or ``metadata.task_id``."""
    text = body_id(field, value)
    if text:
        text_id(field, text, TASK_ID_CHARS)


def end_user(value: Any, field: str) -> None:
    """The end user (``user``, ``metadata.user_id``, ``metadata.end_user``): any text (hashed when long)."""
    body_id(field, value)


def tags(value: Any, field: str) -> None:
    """Tags: a comma-separated string or a list of strings, each at most :data:`TAG_CHARS`, at most :data:`MAX_TAGS`."""
    if value is None or value == "":
        return
    if isinstance(value, str):
        items = [t.strip() for t in value.split(",") if t.strip()]
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise InvalidRequest(
                    f"{field}[{i}] must be a string, not {_kind(item)}", param=field, code="invalid_type"
                )
        items = value
    else:
        raise InvalidRequest(
            f"{field} must be a comma-separated string or a list of strings, not {_kind(value)}",
            param=field,
            code="invalid_type",
        )
    if len(items) > MAX_TAGS:
        raise InvalidRequest(
            f"{field} holds {len(items)} tags; at most {MAX_TAGS} are recorded", param=field, code="invalid_value"
        )
    for item in items:
        text_id(field, item, TAG_CHARS)


def metadata(value: Any) -> dict[str, Any]:
    """The body's ``metadata``: an object, or absent (null)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"metadata must be an object, not {_kind(value)}", param="metadata", code="invalid_type")
    return value


def check_call(headers: Mapping[str, str], body: dict[str, Any], path_session: str | None) -> None:
    """Every client value a call's record stores, from its headers (lower-cased names), body and path.

    Called at the edge (proxy/handle.py) on the body as the client sent it, before a dialect
    translates it: every dialect is checked by this one function.
    """
    client_request_id(headers.get("x-client-request-id"))
    session_id(headers.get("x-session-id"), "X-Session-Id")
    task_id(headers.get("x-task-id"), "X-Task-Id")
    tags(headers.get("x-onthejob-tags"), "X-Onthejob-Tags")
    if path_session is not None:
        session_id(path_session, "session_id")
    meta = metadata(body.get("metadata"))
    session_id(meta.get("session_id"), "metadata.session_id")
    task_id(meta.get("task_id"), "metadata.task_id")
    end_user(meta.get("user_id"), "metadata.user_id")
    end_user(meta.get("end_user"), "metadata.end_user")
    tags(meta.get("tags"), "metadata.tags")
    end_user(body.get("user"), "user")


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        bool: "a boolean",
        float: "a number",
        int: "an integer",
        str: "a string",
    }.get(type(value), type(value).__name__)


def limits() -> dict[str, int]:
    """The limits, by name (what ``python -m proxy.admission`` prints)."""
    return {
        "client_request_id_chars": CLIENT_REQUEST_ID_CHARS,
        "session_id_chars": SESSION_ID_CHARS,
        "call_id_chars": CALL_ID_CHARS,
        "task_id_chars": TASK_ID_CHARS,
        "end_user_chars_before_hashing": END_USER_CHARS,
        "tag_chars": TAG_CHARS,
        "max_tags": MAX_TAGS,
    }


if __name__ == "__main__":
    for name, value in limits().items():
        print(f"{name:32} {value}")
