"""One proxied call: from the engine-facing body to the engine's reply and the call's record.

:class:`ProxiedCall` is made by :func:`proxy.handle.handle` once a request is admitted,
translated, routed and linked to its session. It forwards the body with capture
fields forced on to an engine replica and either returns the reply (after its record
is fsync'd, proxy/recording.py) or streams chunk by chunk (proxy/streaming.py),
holding back only the terminal event until the record is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson
from starlette.responses import Response

from proxy import capture, link_keys, sessions
from proxy.dialects.base import Dialect, DialectStream, Exchange, engine_error
from proxy.errors import UpstreamError, UpstreamTimeout
from proxy.recording import Recording
from proxy.replicas import Replica
from proxy.routing import Router
from proxy.served import Route
from proxy.streaming import Finished, StreamedReply
from proxy.upstream import UPSTREAM_FAILURES, Upstream, UpstreamConnectError, UpstreamIdleTimeout, UpstreamResponse
from storage.records import CallRecord, dump_json, end_user_key

log = logging.getLogger("onthejob.proxy")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class ProxiedCall:
    """One proxied call and the record it becomes.

    It sees only what it uses: the engine (``upstream``, ``router`` for reloading a
    lost adapter) and ``recording`` (spool, redaction, metrics, links). ``body`` is the
    engine-facing chat/text completions body. Native calls answer with the engine's
    reply stripped back to what vLLM would have sent; a ``dialect`` call
    (``client_request``: what the harness sent) answers with the dialect's translation
    of each reply or chunk, and records both sides. ``raw_body``: the bytes the client's
    request body was parsed from (the ``body`` of a native call, the ``client_request`` of a
    dialect's), its column's text when redaction leaves that body as it was.
    """

    def __init__(
        self,
        upstream: Upstream,
        router: Router,
        recording: Recording,
        *,
        project: str,
        endpoint: str,
        body: dict[str, Any],
        route: Route,
        naming: link_keys.Naming,
        session: sessions.SessionRef,
        prompt_key: str | None = None,
        dialect: Dialect | None = None,
        client_request: dict[str, Any] | None = None,
        inflight: set[asyncio.Task[None]] | None = None,
        raw_body: bytes | None = None,
    ) -> None:
        self.upstream = upstream
        self.router = router
        self.recording = recording
        # 128 random bits, as uuid4 gives, at a fifth of its cost
        self.id = dialect.new_id() if dialect else "cmpl-" + os.urandom(16).hex()
        self.project = project
        self.endpoint = endpoint
        self.body = body
        self.route = route
        self.naming = naming
        self.session = session
        self.prompt_key = prompt_key  # the request messages' prefix key (chat only)
        self.dialect = dialect
        self.client_request = client_request
        self.raw_body = raw_body
        self.inflight = inflight if inflight is not None else set()
        self.created = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.ttft_ms: float | None = None
        self.saved = False
        self.base = ""
        self.replica: Replica | None = None  # while the call occupies it
        self.events: DialectStream | None = None  # a dialect's stream translator, once streaming
        self.upstream_body, self.wants = capture.prepare(body, endpoint, route.served_model)

    @property
    def headers(self) -> dict[str, str]:
        return {"x-request-id": self.id, "x-session-id": header_value(self.session.id)}

    async def open(self) -> UpstreamResponse:
        """Send the call to an engine replica (proxy/replicas.py chooses it) and return the response unread.

        A call that could not connect, or whose connection broke before any response
        header, is sent to another replica; it is recorded once, as its last try ended.
        A lost adapter (404 under ``alias@vN``) is loaded again and the call sent once more.
        """
        payload = orjson.dumps(self.upstream_body)
        replicas, served, metrics = self.router.replicas, self.route.served_model, self.router.metrics
        tried: set[str] = set()
        reloaded, error = False, f"no engine replica may serve {served}"
        while (replica := replicas.pick(served, self.session.id, frozenset(tried))) is not None:
            self.replica, self.base = replica, replica.url
            replica.inflight += 1
            try:
                resp = await self.upstream.open(replica.url, PATHS[self.endpoint], payload)
            except UpstreamIdleTimeout as exc:  # connected, then silent: the engine may be working on it
                await self.save(status=504, termination="timeout", error="engine did not answer in time")
                raise UpstreamTimeout("the engine did not answer within the connect/idle timeout") from exc
            except UPSTREAM_FAILURES as exc:  # no connection, or it broke before any header
                self.release()
                error = f"{type(exc).__name__}: {exc}"
                connect = isinstance(exc, UpstreamConnectError)
                if replicas.failed(replica, error, eject=connect):
                    log.warning("engine %s out of rotation: %s", replica.url, error)
                metrics.upstream_failures.labels(replica.url, "refused").inc()
                metrics.upstream_retries.labels("refused").inc()
                tried.add(replica.url)
                continue
            if resp.status >= 500:
                metrics.upstream_failures.labels(replica.url, "http_5xx").inc()
                if replicas.failed(replica, f"HTTP {resp.status}", eject=False):
                    log.warning("engine %s out of rotation: repeated HTTP %d", replica.url, resp.status)
            elif resp.status == 404 and self.route.version is not None and not reloaded:
                resp.release()  # the engine restarted and lost our adapter: load it, then once more
                self.release()
                reloaded = True
                metrics.upstream_retries.labels("adapter_missing").inc()
                with contextlib.suppress(Exception):
                    await self.router.ensure_loaded(replica, self.project, self.route.alias, self.route.version)
                continue
            else:
                replicas.succeeded(replica)
                replicas.remember(self.session.id, replica)
            return resp
        await self.save(status=502, termination="upstream_error", error=error)
        raise UpstreamError(f"cannot reach an engine (tried {len(tried)} replica(s)): {error}")

    def release(self) -> None:
        """The call no longer occupies its replica (it ended, or is tried elsewhere)."""
        if self.replica is not None:
            self.replica.inflight -= 1
            self.replica = None

    async def reject(self, resp: UpstreamResponse) -> Response:
        """Upstream said no: 4xx passes through unchanged; 5xx becomes our 502."""
        raw = await resp.read()
        status = resp.status
        text = raw.decode(errors="replace")
        if status < 500:
            await self.save(status=status, termination="rejected", error=text[:4000])
            if self.dialect is not None:
                raise engine_error(status, raw)  # answered in the dialect's own error shape
            return Response(
                raw,
                status,
                headers={**self.headers, "content-type": resp.headers.get("content-type", "application/json")},
            )
        await self.save(status=502, termination="upstream_error", error=f"engine answered {status}: {text[:4000]}")
        raise UpstreamError(f"the engine failed with HTTP {status}; the call was recorded as upstream_error")

    async def complete(self, resp: UpstreamResponse) -> Response:
        """A non-streamed reply: record it durably, then send it."""
        try:
            raw = await resp.read()
        except TimeoutError as exc:
            await self.save(status=504, termination="timeout", error="engine went idle mid-reply")
            raise UpstreamTimeout("the engine went silent past the idle timeout") from exc
        except UPSTREAM_FAILURES as exc:
            await self.save(status=502, termination="upstream_error", error=f"{type(exc).__name__}: {exc}")
            raise UpstreamError("the engine connection broke mid-reply") from exc
        client_json = None
        try:
            # The prompt's ids (as long as the prompt) are stored as the engine wrote them, never parsed.
            reply, ids_json = capture.parse_cutting_ids(raw, self.endpoint == "chat" and not self.wants.token_ids)
            choices = capture.captured_choices(reply, self.endpoint)
            prompt_ids: list[int] | bytes | None = ids_json if ids_json is not None else capture.prompt_ids(reply)
            if self.dialect is not None:  # before strip, which edits the reply in place
                client_json = self.dialect.reply_json(reply, self.exchange())
            out = capture.strip(reply, self.wants, self.route.alias)
            if out is None:
                raise ValueError("a reply without choices")
        except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError, ValueError) as exc:
            await self.save(status=502, termination="upstream_error", error=f"malformed engine reply: {raw[:500]!r}")
            raise UpstreamError("the engine sent a malformed reply") from exc
        self.ttft_ms = (time.perf_counter() - self.t0) * 1000
        if reply.get("system_fingerprint"):
            self.upstream.fingerprints[self.base] = reply["system_fingerprint"]
        # What the client gets is serialised once: the same bytes are its record's column (``response``
        # for a native call, ``client_response`` for a dialect's) unless redaction changes them.
        native = client_json is None
        sent = dump_json(out) if native else client_json
        await self.save(
            status=200,
            termination=capture.termination_of(choices),
            response=out,
            choices=choices,
            prompt_ids=prompt_ids,
            usage=reply.get("usage"),
            upstream_id=reply.get("id"),
            client_json=client_json,
            sent=sent if native else None,
        )
        return Response(sent, 200, headers=self.headers, media_type="application/json")

    def stream(self, resp: UpstreamResponse) -> StreamedReply:
        """A streamed reply: forwarded event by event as it arrives, recorded by :meth:`finish_stream`."""
        self.events = self.dialect.stream(self.exchange()) if self.dialect else None
        return StreamedReply(
            resp,
            endpoint=self.endpoint,
            wants=self.wants,
            alias=self.route.alias,
            headers=self.headers,
            dialect=(self.dialect, self.events) if self.dialect and self.events else None,
            fingerprints=self.upstream.fingerprints,
            base=self.base,
            inflight=self.inflight,
            finish=self.finish_stream,
        )

    def exchange(self) -> Exchange:
        """What a dialect needs to know about this call to translate its reply."""
        assert self.client_request is not None
        return Exchange(self.id, self.route.alias, int(self.created.timestamp()), self.client_request, self.body)

    async def finish_stream(self, end: Finished) -> None:
        """The stream's end (the callback :class:`StreamedReply` is given): record what it added up to."""
        asm = end.assembled
        if end.first_event_at is not None:
            self.ttft_ms = (end.first_event_at - self.t0) * 1000
        await self.save(
            status=end.status,
            termination=end.termination,
            response=asm.response() if asm.chunks else None,
            choices=asm.captured_choices(),
            prompt_ids=asm.prompt_token_ids,
            usage=asm.usage,
            error=end.error,
            upstream_id=asm.head.get("id"),
            client_json=end.client_json,
        )

    async def save(
        self,
        *,
        status: int,
        termination: str,
        response: dict[str, Any] | None = None,
        choices: list[dict[str, Any]] | None = None,
        prompt_ids: list[int] | bytes | None = None,
        usage: dict[str, Any] | None = None,
        error: str | None = None,
        upstream_id: str | None = None,
        client_json: bytes | None = None,
        sent: bytes | None = None,
    ) -> None:
        """Build the record and fsync it to the spool (once per call).

        ``prompt_ids``: a list, or its JSON as the engine wrote it (:func:`proxy.capture.split_prompt_ids`).
        ``client_json``: a dialect call's body as its client got it (serialised), the ``client_response``
        column as it is unless redaction applies (parsed only then). ``sent``: a native call's ``response``
        as serialised for sending, reused as that column's text when redaction leaves it as it was."""
        if self.saved:
            return
        self.saved = True
        self.release()
        recording = self.recording
        dialect = self.dialect.name if self.dialect else self.endpoint
        seconds = time.perf_counter() - self.t0
        recording.finished(self.endpoint, dialect, status, termination, seconds, self.ttft_ms, usage)
        if not recording.enabled:
            return
        choices = choices or []
        keys = [link_keys.link_key(self.prompt_key, c.get("message")) for c in choices]  # before redaction
        policy = recording.policy(self.project)
        # The client's body as a dict only for a policy to walk: else its bytes are the column.
        client_response = orjson.loads(client_json) if client_json is not None and policy.active else None
        text = recording.redacted(
            policy,
            {
                "request": self.body,
                "response": response,
                "choices": choices,
                "error": error,
                "client_request": self.client_request,
                "client_response": client_response,
                "prompt_token_ids": prompt_ids,
            },
        )
        session, error = self.session, text["error"]
        if client_response is not None:
            client_json = dump_json(text["client_response"])
        elif client_json is None:
            client_json = b"null"
        if sent is not None and response is not None and text["response"] is response:
            response_json = sent
        else:
            response_json = dump_json(text["response"])
        # The client's body as it came (not parsed and serialised again) when redaction left it as it was.
        request_json = client_request_json = None
        # Only JSON whose whitespace holds no tab, newline or return can be a spool line's part as it
        # is (and a COPY field with its backslashes doubled); the client's parser (orjson) accepted it.
        if self.raw_body is not None and _compact(self.raw_body):
            if self.dialect is None and text["request"] is self.body:
                request_json = self.raw_body
            elif self.dialect is not None and text["client_request"] is self.client_request:
                client_request_json = self.raw_body
        record = CallRecord(
            id=self.id,
            project_id=self.project,
            session_id=session.id,
            task_id=session.task_id,
            client_request_id=self.naming.client_request_id,
            upstream_id=upstream_id,
            endpoint=self.endpoint,
            dialect=dialect,
            client_request=client_request_json or dump_json(text["client_request"]),
            client_response=client_json,
            alias=self.route.alias,
            served_model=self.route.served_model,
            adapter_version=self.route.version,
            adapter_sha256=self.route.sha256,
            tags=dump_json(self.naming.tags),
            request=request_json or dump_json(text["request"]),
            response=response_json,
            prompt_token_ids=ids if isinstance(ids := text["prompt_token_ids"], bytes) else dump_json(ids),
            choices=dump_json(text["choices"]),
            sampling=dump_json(capture.sampling_params(self.body)),
            usage=dump_json(usage),
            status_code=status,
            termination=termination,
            error=error.replace("\x00", "\ufffd") if error else error,  # Postgres text cannot hold NUL
            stream=self.wants.stream,
            link_key=keys[0] if keys else None,
            parent_id=session.parent_id,
            created_at=self.created.isoformat(),
            latency_ms=seconds * 1000,
            ttft_ms=self.ttft_ms,
            session_source=session.source,
            end_user=end_user_key(self.naming.end_user) if self.naming.end_user else None,
            parsed_request=self.body if request_json is not None else None,  # the dict raw_body parsed to
        )
        await recording.keep(record, keys)


# Printable ASCII: what a response header carries as it is (a session id from the body or the path may
# hold any character; one outside latin-1 failed the reply after it was recorded, a newline would split it).
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(value: str) -> str:
    """``value`` as a response header: as it is when printable ASCII, else percent-encoded (UTF-8)."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe=_HEADER_SAFE)


def _compact(data: bytes) -> bool:
    return b"\n" not in data and b"\t" not in data and b"\r" not in data
