"""A request's body: read off the ASGI channel within the size limit, parsed, and checked for what
the serving path relies on (the engine checks the rest). Errors are the API's 400 and 413."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from proxy import capture
from proxy.errors import InvalidRequest, PayloadTooLarge


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object; 413 past ``limit`` bytes, 400 if it is not a JSON object."""
    return parse_json(await read_body(request.receive, request.headers.get("content-length"), limit))


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The raw body, read straight off the ASGI channel (Starlette's stream adds a layer per chunk)."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit} (ONTHEJOB_MAX_BODY_BYTES)")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"the request body is not valid JSON ({exc}); send a JSON object (integers must fit in 64 bits)"
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def validate(body: dict[str, Any], endpoint: str) -> None:
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise InvalidRequest("'messages' must be a non-empty list of message objects", param="messages")
    elif body.get("prompt") in (None, "", []):
        raise InvalidRequest("'prompt' is required for /v1/completions", param="prompt")
    else:
        capture.check_one_prompt(body["prompt"])
    if "stream" in body and not isinstance(body["stream"], bool):
        raise InvalidRequest("'stream' must be true or false", param="stream")
