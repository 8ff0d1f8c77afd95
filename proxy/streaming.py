"""Streaming: forward each engine event as it arrives, capture it, and record the call at the end.

Only the final ``[DONE]`` waits for the record's fsync. If the client leaves, the
upstream connection is closed (vLLM aborts the request) and the partial reply is
recorded as ``client_disconnected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy import capture
from proxy.errors import ApiError
from proxy.upstream import UPSTREAM_FAILURES, sse_batches

if TYPE_CHECKING:
    from proxy.calls import Call


class StreamCall(Response):
    """Forwards an SSE stream chunk by chunk; cancels upstream and records the partial on disconnect."""

    def __init__(self, call: Call, resp: aiohttp.ClientResponse) -> None:  # noqa: D107 - no Response body
        self.call = call
        self.resp = resp
        self.asm = capture.Assembler(call.endpoint)
        self.held: list[dict[str, Any]] = []
        self.out: list[bytes] = []
        self.background = None
        self.status_code = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        inflight = self.call.st.inflight
        if task is not None:
            inflight.add(task)  # type: ignore[arg-type]
        try:
            await self._serve(receive, send)
        finally:
            if task is not None:
                inflight.discard(task)  # type: ignore[arg-type]

    async def _serve(self, receive: Receive, send: Send) -> None:
        streamer = asyncio.create_task(self._stream(send))
        listener = asyncio.create_task(wait_disconnect(receive))
        done, _ = await asyncio.wait({streamer, listener}, return_when=asyncio.FIRST_COMPLETED)
        if streamer in done:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await streamer
            return
        streamer.cancel()  # the client left: stop reading, close the upstream connection (vLLM aborts)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await streamer
        self.resp.close()
        with contextlib.suppress(ApiError):
            await self._record("client_disconnected", 499, "client disconnected")

    async def _stream(self, send: Send) -> None:
        call = self.call
        headers = [(k.encode(), v.encode()) for k, v in call.headers.items()]
        headers += [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        failure: tuple[str, str] | None = None
        done = False
        try:
            # Everything one network read brought is forwarded in one write: no added delay,
            # far fewer socket writes than one per event.
            async for batch in sse_batches(self.resp):
                for data in batch:
                    if data == b"[DONE]":
                        done = True
                        break
                    failure = self._event(data)
                    if failure:
                        break
                await self._write(send)
                if done or failure:
                    break
            if not done and not failure and not any(c.finish_reason for c in self.asm.choices.values()):
                failure = ("upstream_error", "the engine closed the stream before it finished")
        except TimeoutError:
            failure = ("timeout", "the engine went silent past the idle timeout")
        except UPSTREAM_FAILURES as exc:
            failure = ("upstream_error", f"stream broke: {type(exc).__name__}")
        finally:
            self.resp.release() if failure is None else self.resp.close()
        self._release_held()
        await self._write(send)
        termination, error = failure or (capture.termination_of(self.asm.captured_choices()), None)
        status = 200 if error is None else (504 if termination == "timeout" else 502)
        try:
            await self._record(termination, status, error)
        except ApiError as exc:  # spool full under the refuse policy: tell the client, no [DONE]
            await send({"type": "http.response.body", "body": _sse(exc.body()), "more_body": False})
            return
        tail = b""
        if error is not None:
            kind = "timeout_error" if termination == "timeout" else "upstream_error"
            tail = _sse({"error": {"message": error, "type": kind, "param": None, "code": status}})
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})

    def _event(self, data: bytes) -> tuple[str, str] | None:
        """Take one engine event: capture it, queue what the client gets; a failure ends the stream."""
        call = self.call
        try:
            chunk = orjson.loads(data)
            if not isinstance(chunk, dict):
                raise TypeError("chunk is not an object")
        except (orjson.JSONDecodeError, TypeError):
            return "upstream_error", f"malformed SSE data from the engine: {data[:200]!r}"
        if "error" in chunk and not chunk.get("choices"):
            return "upstream_error", f"engine error mid-stream: {chunk['error']}"
        if call.ttft_ms is None:
            call.ttft_ms = (time.perf_counter() - call.t0) * 1000
        try:
            self.asm.add(chunk)
            if chunk.get("system_fingerprint") and not chunk.get("choices"):
                call.st.upstream.fingerprints[call.base] = chunk["system_fingerprint"]
                self._release_held()
            out = capture.strip(chunk, call.wants, call.route.alias)
        except (TypeError, AttributeError, KeyError, ValueError):
            return "upstream_error", f"malformed chunk from the engine: {data[:200]!r}"
        if out is None:
            return None
        if not call.wants.usage and (self.held or any(c.get("finish_reason") for c in out.get("choices") or ())):
            # Without include_usage vLLM stamps its fingerprint on terminal chunks; we asked
            # for usage, so the fingerprint comes later: hold them until it does.
            self.held.append(out)
            if call.st.upstream.fingerprints.get(call.base):
                self._release_held()
            return None
        self.out.append(_sse(out))
        return None

    def _release_held(self) -> None:
        fingerprint = self.call.st.upstream.fingerprints.get(self.call.base)
        for out in self.held:
            if fingerprint and any(c.get("finish_reason") for c in out.get("choices") or ()):
                out["system_fingerprint"] = fingerprint
            self.out.append(_sse(out))
        self.held.clear()

    async def _write(self, send: Send) -> None:
        if self.out:
            body = b"".join(self.out)
            self.out.clear()
            await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _record(self, termination: str, status: int, error: str | None) -> None:
        call, asm = self.call, self.asm
        choices = asm.captured_choices()
        await call.save(
            status=status,
            termination=termination,
            response=asm.response() if asm.chunks else None,
            choices=choices,
            prompt_ids=asm.prompt_token_ids,
            usage=asm.usage,
            error=error,
            upstream_id=asm.head.get("id"),
        )


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
