"""The serving path: one OpenAI call from harness to engine and into the spool.

Read a request top to bottom in :func:`handle`: authenticate, parse, route the
alias, resolve the session, forward with capture fields forced on, and either
return the stripped reply (after its record is fsync'd) or stream chunk by chunk,
holding back only the final ``[DONE]`` until the record is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from sqlalchemy import select
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive

from proxy import capture, sessions
from proxy.errors import InvalidRequest, PayloadTooLarge, Unavailable, UpstreamError, UpstreamTimeout
from proxy.redact import redact_record
from proxy.routing import Route
from proxy.spool import SpoolFull
from proxy.streaming import StreamCall, wait_disconnect
from proxy.upstream import UPSTREAM_FAILURES
from storage.models import Completion

if TYPE_CHECKING:
    from proxy.deps import Principal
    from proxy.state import AppState

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


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
    if "stream" in body and not isinstance(body["stream"], bool):
        raise InvalidRequest("'stream' must be true or false", param="stream")


async def resolve_session(
    st: AppState, project: str, naming: sessions.Naming, messages: list[dict[str, Any]] | None, keys: list[str]
) -> tuple[str, str, str | None, str | None]:
    """(session id, how it was found, parent completion id, task id) for a call; ``keys``: its prefix keys."""
    link = None
    if messages:
        # A parent's link key always ends with the assistant message it returned.
        candidates = [k for k, m in zip(keys, messages, strict=True) if m.get("role") == "assistant"]
        if candidates:
            link = st.links.longest(project, candidates, naming.session_id)
            if link is None:  # served by another worker, and maybe not yet in the database
                link = _spool_link(st, project, candidates, naming.session_id)
            if link is None:
                link = await _db_link(st, project, candidates, naming.session_id)
    task = naming.task_id or (link.task_id if link else None)
    if naming.session_id:
        return naming.session_id, naming.source, link.completion_id if link else None, task
    if link is not None:
        return link.session_id, "linked", link.completion_id, task
    return sessions.new_session_id(), "new", None, task


def _spool_link(st: AppState, project: str, keys: list[str], session: str | None) -> sessions.Link | None:
    needles = [b'"link_key":"' + key.encode() + b'"' for key in reversed(keys)]  # the longest prefix first
    for record in st.spool.sibling_records(needles):
        call = record.get("completion") or {}
        if call.get("project_id") == project and (session is None or call.get("session_id") == session):
            return sessions.Link(call["session_id"], call["id"], call.get("task_id"))
    return None


async def _db_link(st: AppState, project: str, keys: list[str], session: str | None) -> sessions.Link | None:
    query = select(Completion.id, Completion.session_id, Completion.task_id, Completion.link_key).where(
        Completion.project_id == project, Completion.link_key.in_(keys)
    )
    if session:
        query = query.where(Completion.session_id == session)
    try:
        async with asyncio.timeout(1.0), st.sessionmaker() as db:
            rows = (await db.execute(query.order_by(Completion.created_at.desc()).limit(50))).all()
    except Exception:  # noqa: BLE001 - database down: link from memory only; the call still goes through
        return None
    rank = {k: i for i, k in enumerate(keys)}
    best = max(rows, key=lambda r: rank[r.link_key], default=None)
    return sessions.Link(best.session_id, best.id, best.task_id) if best else None


class Call:
    """One proxied call and the record it becomes."""

    def __init__(
        self,
        st: AppState,
        principal: Principal,
        endpoint: str,
        body: dict[str, Any],
        route: Route,
        naming: sessions.Naming,
        session: tuple[str, str, str | None, str | None],
        prompt_key: str | None = None,
    ) -> None:
        self.st = st
        self.id = "cmpl-" + os.urandom(16).hex()  # 128 random bits, as uuid4 gives, at a fifth of its cost
        self.project = principal.project_id
        self.endpoint = endpoint
        self.body = body
        self.route = route
        self.naming = naming
        self.session_id, self.session_source, self.parent_id, self.task_id = session
        self.prompt_key = prompt_key  # the request messages' prefix key (chat only)
        self.created = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.ttft_ms: float | None = None
        self.saved = False
        self.base = ""
        self.upstream_body, self.wants = capture.prepare(body, endpoint, route.served_model)

    @property
    def headers(self) -> dict[str, str]:
        return {"x-request-id": self.id, "x-session-id": self.session_id}

    async def open(self) -> aiohttp.ClientResponse:
        """Send the call upstream; reload lost adapters and retry once on model-not-found."""
        payload = orjson.dumps(self.upstream_body)
        for attempt in (0, 1):
            base = self.base = self.st.upstream.pick()
            try:
                resp = await self.st.upstream.open(base, PATHS[self.endpoint], payload)
            except TimeoutError as exc:
                await self.save(status=504, termination="timeout", error="engine did not answer in time")
                raise UpstreamTimeout("the engine did not answer within the connect/idle timeout") from exc
            except UPSTREAM_FAILURES as exc:
                await self.save(status=502, termination="upstream_error", error=f"{type(exc).__name__}: {exc}")
                raise UpstreamError(f"cannot reach the engine at {base}: {type(exc).__name__}") from exc
            if resp.status == 404 and attempt == 0 and self.route.version is not None:
                resp.release()
                with contextlib.suppress(Exception):
                    await self.st.router.reconcile(base)  # the engine restarted and lost our adapter
                continue
            return resp
        return resp

    async def reject(self, resp: aiohttp.ClientResponse) -> Response:
        """Upstream said no: 4xx passes through unchanged; 5xx becomes our 502."""
        raw = await resp.read()
        status = resp.status
        text = raw.decode(errors="replace")
        if status < 500:
            await self.save(status=status, termination="rejected", error=text[:4000])
            return Response(
                raw,
                status,
                headers={**self.headers, "content-type": resp.headers.get("content-type", "application/json")},
            )
        await self.save(status=502, termination="upstream_error", error=f"engine answered {status}: {text[:4000]}")
        raise UpstreamError(f"the engine failed with HTTP {status}; the call was recorded as upstream_error")

    async def complete(self, resp: aiohttp.ClientResponse) -> Response:
        """A non-streamed reply: record it durably, then send it."""
        try:
            raw = await resp.read()
        except TimeoutError as exc:
            await self.save(status=504, termination="timeout", error="engine went idle mid-reply")
            raise UpstreamTimeout("the engine went silent past the idle timeout") from exc
        except UPSTREAM_FAILURES as exc:
            await self.save(status=502, termination="upstream_error", error=f"{type(exc).__name__}: {exc}")
            raise UpstreamError("the engine connection broke mid-reply") from exc
        try:
            reply = orjson.loads(raw)
            choices = capture.captured_choices(reply, self.endpoint)
            prompt_ids = capture.prompt_ids(reply)
            out = capture.strip(reply, self.wants, self.route.alias)
        except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError, ValueError) as exc:
            await self.save(status=502, termination="upstream_error", error=f"malformed engine reply: {raw[:500]!r}")
            raise UpstreamError("the engine sent a malformed reply") from exc
        self.ttft_ms = (time.perf_counter() - self.t0) * 1000
        if reply.get("system_fingerprint"):
            self.st.upstream.fingerprints[self.base] = reply["system_fingerprint"]
        await self.save(
            status=200,
            termination=capture.termination_of(choices),
            response=out,
            choices=choices,
            prompt_ids=prompt_ids,
            usage=reply.get("usage"),
            upstream_id=reply.get("id"),
        )
        return Response(orjson.dumps(out), 200, headers=self.headers, media_type="application/json")

    async def save(
        self,
        *,
        status: int,
        termination: str,
        response: dict[str, Any] | None = None,
        choices: list[dict[str, Any]] | None = None,
        prompt_ids: list[int] | None = None,
        usage: dict[str, Any] | None = None,
        error: str | None = None,
        upstream_id: str | None = None,
    ) -> None:
        """Build the record and fsync it to the spool (once per call)."""
        if self.saved:
            return
        self.saved = True
        st = self.st
        st.metrics.termination(termination).inc()
        if not st.settings.record:
            return
        choices = choices or []
        keys = [sessions.link_key(self.prompt_key, c.get("message")) for c in choices]
        record = {
            "id": self.id,
            "project_id": self.project,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "client_request_id": self.naming.client_request_id,
            "upstream_id": upstream_id,
            "endpoint": self.endpoint,
            "alias": self.route.alias,
            "served_model": self.route.served_model,
            "adapter_version": self.route.version,
            "tags": list(self.naming.tags),
            "request": self.body,
            "response": response,
            "prompt_token_ids": prompt_ids,
            "choices": choices,
            "sampling": capture.sampling_params(self.body),
            "usage": usage,
            "status_code": status,
            "termination": termination,
            "error": error.replace("\x00", "\ufffd") if error else error,  # Postgres text cannot hold NUL
            "stream": self.wants.stream,
            "link_key": keys[0] if keys else None,
            "parent_id": self.parent_id,
            "created_at": self.created.isoformat(),
            "latency_ms": (time.perf_counter() - self.t0) * 1000,
            "ttft_ms": self.ttft_ms,
        }
        record = redact_record(record, st.policy(self.project))
        session = {
            "project_id": self.project,
            "id": self.session_id,
            "task_id": self.task_id,
            "source": self.session_source,
            "tags": list(self.naming.tags),
        }
        try:
            await st.spool.append({"completion": record, "session": session})
        except SpoolFull as exc:
            if st.settings.spool_full_policy == "serve":
                st.metrics.records_dropped.labels("spool_full").inc()
                return
            st.metrics.spool_full_rejections.inc()
            raise Unavailable(
                "the recording spool is full; the call was not served unrecorded. Retry later", code="spool_full"
            ) from exc
        st.metrics.records_spooled.inc()
        # The recorder drains every 50 ms on its own; waking it per call made it run one database
        # transaction per request (most of the proxy's CPU at concurrency 1). Wake it early only
        # when a full batch is waiting.
        if st.spool.depth >= st.settings.drain_batch:
            st.recorder.wake.set()
        for key in keys:
            if key:
                st.links.put(self.project, key, sessions.Link(self.session_id, self.id, self.task_id))


async def handle(request: Request, endpoint: str, path_session: str | None = None) -> Any:
    """Serve one OpenAI call (chat or completions), streaming or not."""
    st: AppState = request.app.state.onthejob
    if st.draining:
        raise Unavailable("the proxy is shutting down; retry on another replica", code="draining")
    # One pass over the raw headers (first occurrence wins, as in Starlette): Headers.get scans
    # the list and raises KeyError for each absent one, and naming() asks for four, mostly absent.
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(request.scope["headers"])}
    principal = await st.auth.authenticate(headers.get("authorization"), headers.get("x-api-key"))
    st.ratelimiter.check(principal.key_id)
    body = parse_json(await read_body(request.receive, headers.get("content-length"), st.settings.max_body_bytes))
    validate(body, endpoint)
    if st.spool.full and st.settings.spool_full_policy == "refuse" and st.settings.record:
        st.metrics.spool_full_rejections.inc()
        raise Unavailable(
            "the recording spool is full (database unreachable for too long?); retry later", code="spool_full"
        )
    route = st.router.resolve(principal.project_id, body.get("model"))
    naming = sessions.naming(headers, body, path_session)
    messages = body.get("messages") if endpoint == "chat" else None
    keys = sessions.prefix_keys(messages) if messages else []
    session = await resolve_session(st, principal.project_id, naming, messages, keys)
    call = Call(st, principal, endpoint, body, route, naming, session, keys[-1] if keys else None)
    # Serve inline; one watcher task cancels us if the client leaves before its reply (or first chunk).
    me = asyncio.current_task()
    assert me is not None
    st.inflight.add(me)  # type: ignore[arg-type]
    gone = asyncio.Event()
    watcher = asyncio.create_task(_cancel_on_disconnect(request.receive, me, gone))
    try:
        return await _serve(call)
    except asyncio.CancelledError:
        if not gone.is_set():
            raise  # a real cancellation (shutdown), not a disconnect
        me.uncancel()
        await call.save(status=499, termination="client_disconnected", error="client disconnected before the reply")
        return Response(status_code=499)
    finally:
        watcher.cancel()
        st.inflight.discard(me)  # type: ignore[arg-type]


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any], gone: asyncio.Event) -> None:
    await wait_disconnect(receive)
    gone.set()
    task.cancel()


async def _serve(call: Call) -> Response:
    resp = await call.open()
    if resp.status >= 400:
        return await call.reject(resp)
    if call.wants.stream:
        return StreamCall(call, resp)
    return await call.complete(resp)
