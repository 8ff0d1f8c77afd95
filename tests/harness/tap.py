"""Test equipment between the proxy and the engine, and a trap for traffic that tries to leave the machine.

:class:`EngineTap` relays every request to the engine unchanged and keeps, for each call, the
token ids the engine itself returned (``token_ids`` of a reply or of each stream chunk): the
independent account that a recording is compared with. :class:`OutboundTrap` is the HTTP(S)
proxy the CLIs are pointed at for every address but 127.0.0.1: any connection it accepts is
an attempt to reach somewhere off this machine.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import free_port

HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass
class EngineCall:
    """One call as the engine answered it."""

    path: str
    request: dict[str, Any]
    status: int = 0
    token_ids: dict[int, list[int]] = field(default_factory=dict)  # choice index -> sampled ids
    prompt_token_ids: list[int] | None = None


def _absorb(call: EngineCall, body: dict[str, Any]) -> None:
    if body.get("prompt_token_ids") is not None:
        call.prompt_token_ids = body["prompt_token_ids"]
    for choice in body.get("choices") or []:
        call.token_ids.setdefault(int(choice.get("index", 0)), []).extend(choice.get("token_ids") or [])


def _absorb_sse(call: EngineCall, text: str) -> None:
    for line in text.splitlines():
        if line.startswith("data: {"):
            _absorb(call, json.loads(line[6:]))


class EngineTap:
    """A transparent relay to ``upstream`` on its own thread; ``calls`` are the POSTs it relayed."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.calls: list[EngineCall] = []
        self._server = uvicorn.Server(uvicorn.Config(self._app(), port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EngineTap:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("engine tap did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def posts(self, path: str) -> list[EngineCall]:
        return [c for c in self.calls if c.path == path]

    def _app(self) -> Starlette:
        holder: dict[str, httpx.AsyncClient] = {}

        async def relay(request: Request) -> Response:
            client = holder.get("client")
            if client is None:
                client = holder["client"] = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10))
            body = await request.body()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP | {"host"}}
            upstream = client.build_request(
                request.method,
                self.upstream + request.url.path,
                params=request.query_params,
                headers=headers,
                content=body,
            )
            resp = await client.send(upstream, stream=True)
            out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
            call = None
            if request.method == "POST":
                call = EngineCall(request.url.path, json.loads(body) if body else {}, resp.status_code)
                self.calls.append(call)
            if resp.headers.get("content-type", "").startswith("text/event-stream"):

                async def chunks() -> Any:
                    seen: list[bytes] = []
                    try:
                        async for chunk in resp.aiter_raw():
                            seen.append(chunk)
                            yield chunk
                    finally:
                        await resp.aclose()
                        if call is not None:
                            _absorb_sse(call, b"".join(seen).decode())

                return StreamingResponse(chunks(), status_code=resp.status_code, headers=out_headers)
            raw = await resp.aread()
            await resp.aclose()
            if call is not None and resp.headers.get("content-type", "").startswith("application/json"):
                _absorb(call, json.loads(raw))
            return Response(raw, status_code=resp.status_code, headers=out_headers)

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]
        return Starlette(routes=[Route("/{path:path}", relay, methods=methods)])


class OutboundTrap:
    """A listener the CLIs get as HTTP_PROXY/HTTPS_PROXY; it answers nothing and counts who came."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.attempts: list[bytes] = []  # the first bytes each one sent (a CONNECT line names the host)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.attempts.append(conn.recv(512))
                except OSError:
                    self.attempts.append(b"")
                try:
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
