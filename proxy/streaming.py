"""Streaming: forward each engine event as it arrives, capture it, and record the call at the end.

Only the final terminal event waits for the record's fsync. If the client leaves, the
upstream connection is closed (vLLM aborts the request) and the partial reply is
recorded as ``client_disconnected``. The stream knows nothing of the call it belongs
to: it hands what it assembled to a finish callback (``ProxiedCall.finish_stream``).

What the client gets: the engine's chunks stripped back to what vLLM would have sent
it (native chat/text completions), or, for a dialect (proxy/dialects/base.py), what
its :class:`DialectStream` makes of each engine chunk as it arrives, opened by
``open()`` and ended by ``close()``, whose events are held until the record is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy import capture
from proxy.dialects.base import Dialect, DialectStream
from proxy.dialects.base import StreamEnd as DialectEnd
from proxy.dialects.base import sse as dialect_sse
from proxy.errors import ApiError, envelope
from proxy.upstream import UPSTREAM_FAILURES, UpstreamResponse, sse_batches


@dataclass(frozen=True, slots=True)
class Finished:
    """How a stream ended, and what it added up to."""

    termination: str
    status: int
    error: str | None
    assembled: capture.Assembler
    first_event_at: float | None  # perf_counter() of the first engine event (time to first token)
    client_json: bytes | None = None  # a dialect's: the body its events added up to, serialised


# Records the call; raises ApiError when it cannot (spool full under the refuse policy).
Finish = Callable[[Finished], Awaitable[None]]


class StreamedReply(Response):
    """Forwards an SSE stream chunk by chunk; cancels upstream and records the partial on disconnect."""

    def __init__(  # noqa: D107 - no Response body
        self,
        resp: UpstreamResponse,
        *,
        endpoint: str,
        wants: capture.Wants,
        alias: str,
        headers: dict[str, str],
        dialect: tuple[Dialect, DialectStream] | None = None,
        fingerprints: dict[str, str],
        base: str,
        inflight: set[asyncio.Task[None]],
        finish: Finish,
    ) -> None:
        self.resp = resp
        self.wants = wants
        self.alias = alias
        self.call_headers = headers
        self.dialect = dialect
        self.fingerprints = fingerprints  # per engine replica (Upstream.fingerprints); ``base`` served us
        self.base = base
        self.inflight = inflight
        self.finish = finish
        self.asm = capture.Assembler(endpoint)
        # A native chat stream's prompt ids (its first chunk's) are kept as the engine wrote them, never parsed.
        self.cut_ids = endpoint == "chat" and dialect is None and not wants.token_ids
        self.first_event_at: float | None = None
        self.held: list[dict[str, Any]] = []
        self.out: list[bytes] = []
        self.last_write = time.perf_counter()  # a dialect with pings sends one after this long a silence
        self.background = None
        self.status_code = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        inflight = self.inflight
        if task is not None:
            inflight.add(task)
        try:
            await self._serve(receive, send)
        finally:
            if task is not None:
                inflight.discard(task)

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
        headers = [(k.encode(), v.encode()) for k, v in self.call_headers.items()]
        headers += [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if self.dialect is not None:
            self.out.append(self.dialect[1].open())
        pinger = self._pinger(send)
        failure: tuple[str, str] | None = None
        done = ended = False  # the engine's [DONE] came; the stream ran to its end (not cancelled)
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
            ended = True
            if not done and not failure and not any(c.finish_reason for c in self.asm.choices.values()):
                failure = ("upstream_error", "the engine closed the stream before it finished")
        except TimeoutError:
            failure = ("timeout", "the engine went silent past the idle timeout")
        except UPSTREAM_FAILURES as exc:
            failure = ("upstream_error", f"stream broke: {type(exc).__name__}")
        finally:
            if pinger is not None:
                pinger.cancel()
            # Cancelled (the client left) or failed: close, so the engine sees it and stops generating.
            self.resp.release() if ended and failure is None else self.resp.close()
        self._release_held()
        await self._write(send)
        termination, error = failure or (capture.termination_of(self.asm.captured_choices()), None)
        status = 200 if error is None else (504 if termination == "timeout" else 502)
        tail, client_json = self._tail(termination, status, error)
        try:
            await self._record(termination, status, error, client_json)
        except ApiError as exc:  # spool full under the refuse policy: tell the client, no terminal event
            await send({"type": "http.response.body", "body": self._failure(exc), "more_body": False})
            return
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    def _tail(self, termination: str, status: int, error: str | None) -> tuple[bytes, bytes | None]:
        """The terminal bytes (sent once the record is on disk), and a dialect's whole reply, serialised."""
        if self.dialect is not None:
            stream = self.dialect[1]
            return stream.close(DialectEnd(termination, self.asm.usage, error)), stream.result_bytes()
        tail = b""
        if error is not None:
            kind = "timeout_error" if termination == "timeout" else "upstream_error"
            tail = _sse(envelope(error, kind, None, status))
        return tail + b"data: [DONE]\n\n", None

    def _failure(self, exc: ApiError) -> bytes:
        if self.dialect is not None:
            dialect, stream = self.dialect
            return stream.fail(exc) or dialect_sse("error", dialect.error(exc)[1])
        return _sse(exc.body())

    def _event(self, data: bytes) -> tuple[str, str] | None:
        """Take one engine event: capture it, queue what the client gets; a failure ends the stream."""
        try:
            chunk, ids_json = capture.parse_cutting_ids(data, self.cut_ids and self.asm.prompt_token_ids is None)
            if not isinstance(chunk, dict):
                raise TypeError("chunk is not an object")
            if ids_json is not None:
                self.asm.prompt_token_ids = ids_json
        except (orjson.JSONDecodeError, TypeError):
            return "upstream_error", f"malformed SSE data from the engine: {data[:200]!r}"
        if "error" in chunk and not chunk.get("choices"):
            return "upstream_error", f"engine error mid-stream: {chunk['error']}"
        if self.first_event_at is None:
            self.first_event_at = time.perf_counter()
        try:
            self.asm.add(chunk)
            if not chunk.get("choices") and (chunk.get("system_fingerprint") or chunk.get("usage")):
                # The usage chunk says what this engine stamps: its fingerprint, or "" for none (an engine
                # that sends none: later streams hold nothing for it).
                self.fingerprints[self.base] = chunk.get("system_fingerprint") or ""
                self._release_held()
            if self.dialect is not None:  # the dialect reads the capture fields itself, as it needs
                self.out.append(self.dialect[1].feed(chunk))
                return None
            out = capture.strip(chunk, self.wants, self.alias)
        except (TypeError, AttributeError, KeyError, ValueError):
            return "upstream_error", f"malformed chunk from the engine: {data[:200]!r}"
        if out is None:
            return None
        if not self.wants.usage and (self.held or any(c.get("finish_reason") for c in out.get("choices") or ())):
            # Without include_usage vLLM stamps its fingerprint on terminal chunks; we asked
            # for usage, so the fingerprint comes later: hold them until it does (only until the
            # first usage chunk of this engine said which fingerprint it stamps, or none).
            self.held.append(out)
            if self.base in self.fingerprints:
                self._release_held()
            return None
        self.out.append(_sse(out))
        return None

    def _release_held(self) -> None:
        fingerprint = self.fingerprints.get(self.base)
        for out in self.held:
            if fingerprint and any(c.get("finish_reason") for c in out.get("choices") or ()):
                out["system_fingerprint"] = fingerprint
            self.out.append(_sse(out))
        self.held.clear()

    async def _write(self, send: Send) -> None:
        if self.out:
            body = b"".join(self.out)
            self.out.clear()
            self.last_write = time.perf_counter()
            await send({"type": "http.response.body", "body": body, "more_body": True})

    def _pinger(self, send: Send) -> asyncio.Task[None] | None:
        """For a dialect that keeps a silent stream alive (Anthropic's ``ping``): the task that does."""
        if self.dialect is None or not self.dialect[0].ping_interval_s or not self.dialect[1].ping():
            return None
        return asyncio.create_task(self._ping(send, self.dialect[0].ping_interval_s, self.dialect[1].ping()))

    async def _ping(self, send: Send, interval: float, frame: bytes) -> None:
        # One timer per stream, not a timeout per read: the chunk path stays as it is. A ping is a
        # whole SSE frame written between two others, never inside one (ASGI sends are whole writes).
        while True:
            await asyncio.sleep(max(0.0, self.last_write + interval - time.perf_counter()))
            if time.perf_counter() - self.last_write >= interval:
                self.last_write = time.perf_counter()
                try:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                except Exception:  # noqa: BLE001 - the client left: the stream's own path records that
                    return

    async def _record(self, termination: str, status: int, error: str | None, client_json: bytes | None = None) -> None:
        await self.finish(Finished(termination, status, error, self.asm, self.first_event_at, client_json))


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
