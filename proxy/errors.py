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
└── UpstreamTimeout     504    connect or idle-between-chunks timeout
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    status = 500
    type = "server_error"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None
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
    status = 503
    type = "service_unavailable"


class UpstreamTimeout(ApiError):
    status = 504
    type = "timeout_error"
