"""The serving path: one call from harness to engine and into the spool.

Read a request top to bottom in :func:`handle`: admit (key, rate limit), parse,
translate at the edge (a dialect, proxy/dialects/base.py), route the alias,
resolve the session (proxy/sessions.py), then :class:`proxy.calls.ProxiedCall`
forwards the engine-facing body and records what came back.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from proxy import admission, link_keys, sessions
from proxy.calls import ProxiedCall
from proxy.dialects.base import Dialect, Stored
from proxy.errors import InvalidRequest, NotFound, Unavailable, UpstreamError
from proxy.request_body import parse_json, read_body, validate
from proxy.streaming import wait_disconnect

if TYPE_CHECKING:
    from proxy.state import AppState


async def handle(
    request: Request, endpoint: str, path_session: str | None = None, dialect: Dialect | None = None
) -> Any:
    """Serve one call, streaming or not: native chat/text completions, or a ``dialect``'s request as a chat call.

    A dialect (proxy/dialects/base.py) plugs in here and nowhere else: its request is
    translated at the edge (``to_chat``), the call then takes the chat path (routing,
    linking, capture, one record), and :class:`ProxiedCall` hands the engine's reply, or each
    chunk as it arrives, to the dialect to translate back. Its route calls
    ``handle(request, "chat", dialect=...)`` (or goes through the fast path,
    proxy/routes_openai.py); errors are answered by ``dialect.error``.
    """
    st: AppState = request.app.state.onthejob
    if st.draining:
        raise Unavailable("the proxy is shutting down; retry on another replica", code="draining")
    # One pass over the raw headers (first occurrence wins, as in Starlette): Headers.get scans
    # the list and raises KeyError for each absent one, and naming() asks for four, mostly absent.
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(request.scope["headers"])}
    authorization = dialect.credentials(headers) if dialect else headers.get("authorization")
    client = request.scope.get("client")
    principal = await st.auth.admit(authorization, headers.get("x-api-key"), client[0] if client else None)
    raw = await read_body(request.receive, headers.get("content-length"), st.settings.max_body_bytes)
    client_body = parse_json(raw)
    admission.check_call(headers, client_body, path_session)  # what the record stores from the client (400)
    body, client_request, previous = client_body, None, None
    if dialect is not None:
        dialect.stream_requested(client_body)
        previous = await _previous(st, principal.project_id, dialect, client_body)
        body, client_request = dialect.to_chat(client_body, previous), client_body
    validate(body, endpoint)
    st.recording.check_room()
    st.recording.check_policy(principal.project_id)
    naming = link_keys.naming(headers, client_body, path_session)
    route, naming = await st.promotion.resolve(principal, body.get("model"), naming)
    messages = body.get("messages") if endpoint == "chat" else None
    keys = link_keys.prefix_keys(messages, link_keys.link_scope(principal.key_id, naming.end_user)) if messages else []
    if previous is not None and naming.session_id in (None, previous.session_id):
        # Continued by id: the stored call's session, with it as parent (whatever the prefix says).
        task = naming.task_id or previous.task_id
        session = sessions.SessionRef(
            previous.session_id, naming.source if naming.session_id else "linked", previous.id, task
        )
    else:
        session = await st.linker.resolve(principal.project_id, naming, messages, keys)
        if session.source == "ambiguous_link":
            st.metrics.ambiguous_links.inc()
    route = st.promotion.arm(principal.project_id, route, session.id, naming.tags)  # a canary's share of sessions
    call = ProxiedCall(
        st.upstream,
        st.router,
        st.recording,
        project=principal.project_id,
        endpoint=endpoint,
        body=body,
        route=route,
        naming=naming,
        session=session,
        prompt_key=keys[-1] if keys else None,
        dialect=dialect,
        client_request=client_request,
        inflight=st.inflight,
        raw_body=raw,
    )
    request.scope["onthejob.call"] = call.id  # from here on the call counts itself (proxy/routes_openai.py)
    # Serve inline; one watcher task cancels us if the client leaves before its reply (or first chunk).
    me = asyncio.current_task()
    assert me is not None
    st.inflight.add(me)
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
        st.inflight.discard(me)


async def _previous(st: AppState, project: str, dialect: Dialect, body: dict[str, Any]) -> Stored | None:
    """The stored call a dialect request continues (``previous_response_id``), found as linking finds one."""
    call_id = dialect.previous_id(body)
    if call_id is None:
        return None
    try:
        found = await st.linker.find_call(project, call_id)
    except Exception as exc:  # noqa: BLE001 - database down and not in memory or a sibling's spool
        raise Unavailable(f"cannot look up {call_id!r} now (database unreachable); retry shortly") from exc
    if found is None or found.dialect != dialect.name:
        raise InvalidRequest(
            f"no stored {dialect.name} call {call_id!r} in this project",
            param=dialect.previous_param,
            code="previous_response_not_found",
        )
    return found


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any], gone: asyncio.Event) -> None:
    await wait_disconnect(receive)
    gone.set()
    task.cancel()


async def _serve(call: ProxiedCall) -> Response:
    resp = await call.open()
    if resp.status >= 400:
        return await call.reject(resp)
    if call.wants.stream:
        return call.stream(resp)
    return await call.complete(resp)


async def engine_token_count(st: Any, payload: dict[str, Any]) -> int:
    """The prompt's token count by the engine's ``/tokenize`` (a dialect's ``count_tokens`` route; nothing
    recorded), its failures in our error classes: the dialect's route puts them in its shape."""
    try:
        status, reply = await st.upstream.post_json(st.router.replicas.any_up().url, "/tokenize", payload, timeout=30)
    except Exception as exc:  # noqa: BLE001 - any transport failure is the engine's
        raise UpstreamError(f"cannot reach the engine to count tokens: {type(exc).__name__}") from exc
    if status == 404:
        raise NotFound(f"the engine has no tokenizer route or no model {payload['model']!r}", param="model")
    if status >= 500 or not isinstance(reply, dict):
        raise UpstreamError(f"the engine failed to count tokens (HTTP {status})")
    if status >= 400:
        detail = reply.get("error", reply)
        message = detail.get("message") if isinstance(detail, dict) else None
        raise InvalidRequest(f"the engine refused the request: {message or reply}")
    return int(reply["count"])
