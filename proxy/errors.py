"""The proxy's one exception tree, converted once into the OpenAI error envelope.

ApiError                       {"error": {"message", "type", "param", "code"}}
├── InvalidRequest      400    malformed JSON, a field of the wrong type (names the field)
├── Unauthorized        401    missing or unknown API key
├── Forbidden           403    a harness key on an admin route
├── NotFound            404    unknown alias (code model_not_found), record, route
├── Conflict            409    an idempotency key reused for different content
├── PayloadTooLarge     413    body over the limit
├── RateLimited         429    token bucket empty
├── UpstreamError       502    engine answered 5xx, refused, reset, or sent garbage
├── Unavailable         503    spool full (policy: refuse rather than serve unrecorded)
│   └── DatabaseUnavailable 503  a read needs the database and it does not answer (Retry-After)
└── UpstreamTimeout     504    connect or idle-between-chunks timeout

Anything else a route raises is answered 500 in the same envelope (proxy/app.py), never as
plain text; :data:`DATABASE_DOWN` is what counts as the database not answering.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import exc as sa_exc

# Retry-After on a 503: the database pool reconnects (pre-ping) on the next request, a spool drains.
RETRY_AFTER_S = 5


class ApiError(Exception):
    status = 500
    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return envelope(self.message, self.type, self.param, self.code)


def envelope(message: str, kind: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """The OpenAI error envelope: every error this proxy answers (natively) is built here."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class InvalidRequest(ApiError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"


class Forbidden(ApiError):
    status = 403
    type = "permission_error"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"


class Conflict(ApiError):
    status = 409
    type = "conflict_error"


class PayloadTooLarge(ApiError):
    status = 413
    type = "invalid_request_error"


class RateLimited(ApiError):
    status = 429
    type = "rate_limit_error"


class UpstreamError(ApiError):
    status = 502
    type = "upstream_error"


class Unavailable(ApiError):
    """503: every one says when to come back (``Retry-After``), the database, the spool or a drain alike."""

    status = 503
    type = "service_unavailable"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("retry-after", str(RETRY_AFTER_S))


class UpstreamTimeout(ApiError):
    status = 504
    type = "timeout_error"


class DatabaseUnavailable(Unavailable):
    """A request that needs the database while it does not answer: 503, retry shortly."""

    def __init__(self, message: str = "the database is unreachable now; retry shortly") -> None:
        super().__init__(message, code="database_unavailable")


# The database not answering, as the driver or the pool says it (connection refused or reset,
# server gone, pool exhausted, a statement cancelled or deadlocked: all worth a retry).
DATABASE_DOWN: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    ConnectionError,
)
