"""A JSON response rendered by orjson (datetimes included); FastAPI's own is deprecated."""

from __future__ import annotations

import json
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.responses import JSONResponse

from proxy.errors import ApiError


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(BaseModel):
    """The OpenAI error envelope every failure answers with."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in {
        400: "invalid request (names the field)",
        401: "missing or invalid API key",
        403: "needs an admin key",
        409: "an idempotency key reused for different content",
        404: "unknown alias, record or route",
        413: "body too large",
        429: "rate limited",
        499: "the client disconnected",
        502: "the engine failed",
        503: "spool full, draining or database unreachable",
        504: "the engine timed out",
    }.items()
}


class ORJSONResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:  # e.g. an integer past 64 bits in a stored request body
            return json.dumps(content, default=str, ensure_ascii=False).encode()


def error_response(exc: ApiError) -> ORJSONResponse:
    """The OpenAI error envelope for one of our errors."""
    return ORJSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
