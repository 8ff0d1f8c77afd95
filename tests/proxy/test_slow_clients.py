"""Slow clients that read nothing: the proxy stays responsive, buffers boundedly, and cleans up on hang-up.

A client opens several long streams (the stub would emit a million tokens, one
a millisecond) and never reads a byte. Its socket buffers fill, the proxy's
writes to it block, and the proxy stops reading the engine (backpressure, no
unbounded buffering). Meanwhile other clients must be served normally. When
the slow client finally closes its sockets, each call is recorded as
``client_disconnected`` with the tokens generated so far, and each upstream
request is cancelled (the stub counts the connections the proxy dropped).
"""

from __future__ import annotations

import array
import fcntl
import socket
import termios
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.models import Completion
from tests.proxy.conftest import Proxy, ProxyFactory

SLOW_STREAMS = 4


def _stats(stub: str) -> dict[str, int]:
    return httpx.get(f"{stub}/stub/stats", timeout=10).json()  # type: ignore[no-any-return]


def _wait_for(what: str, check: Any, timeout: float = 20.0) -> None:
    """Bounded wait for a condition; fails with ``what`` if it never holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what}")


def _open_unread_stream(proxy: Proxy, client_request_id: str) -> socket.socket:
    """Send one streaming request on a raw socket and never read the reply."""
    body = orjson.dumps(
        {
            "model": "stub-model",
            "messages": [{"role": "user", "content": "slow reader"}],
            "stream": True,
            "max_tokens": 1_000_000,
            "stub_gap_ms": 1,
        }
    )
    url = urlsplit(proxy.url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small receive buffer (set before connecting, so the window is small from the start):
    # backpressure reaches the proxy after a few hundred chunks.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.settimeout(10)
    sock.connect((url.hostname, url.port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-Client-Request-Id: {client_request_id}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _unread_bytes(sock: socket.socket) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return buf[0]


def test_clients_that_read_nothing_do_not_stall_the_proxy(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    proxy = start_proxy(stub_upstream, pg_factory())
    before = _stats(stub_upstream)
    run = uuid.uuid4().hex[:8]
    slow_ids = [f"slow-{run}-{i}" for i in range(SLOW_STREAMS)]
    socks = [_open_unread_stream(proxy, cid) for cid in slow_ids]
    try:
        # Every slow stream reached the engine ...
        _wait_for(
            "the engine to receive every slow stream",
            lambda: _stats(stub_upstream)["streams"] >= before["streams"] + SLOW_STREAMS,
        )
        # ... and the proxy has filled the slow client's buffers: the unread bytes stop growing.
        seen: list[int] = []

        def plateaued() -> bool:
            seen.append(sum(_unread_bytes(s) for s in socks))
            return len(seen) >= 6 and seen[-1] > 0 and seen[-1] == seen[-6]

        _wait_for("the slow client's receive buffers to fill (backpressure)", plateaued)

        # Other clients are served normally meanwhile (bounded by the client timeout, not timed).
        normal = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        with httpx.Client(timeout=10) as client:
            resp = client.post(f"{proxy.v1}/chat/completions", json=normal)
            assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"]
            normal_id = resp.headers["x-request-id"]
            with client.stream("POST", f"{proxy.v1}/chat/completions", json={**normal, "stream": True}) as sresp:
                lines = [line for line in sresp.iter_lines() if line]
                assert sresp.status_code == 200 and lines[-1] == "data: [DONE]"
                stream_id = sresp.headers["x-request-id"]
            assert client.get(f"{proxy.url}/healthz").status_code == 200
        # The slow streams are still open: the engine has not been told to stop yet.
        assert _stats(stub_upstream)["cancelled"] == before["cancelled"]
    finally:
        for sock in socks:
            sock.close()  # hang up with unread data (the kernel sends a reset)

    # Hanging up cancels every upstream request ...
    _wait_for(
        "every slow stream's upstream request to be cancelled",
        lambda: _stats(stub_upstream)["cancelled"] >= before["cancelled"] + SLOW_STREAMS,
    )
    assert _stats(stub_upstream)["cancelled"] == before["cancelled"] + SLOW_STREAMS

    # ... and every call is recorded, with the tokens the engine had produced.
    proxy.wait_drained(timeout=30)
    eng = sync_engine(proxy.db_url)
    with Session(eng) as db:
        rows = list(db.scalars(select(Completion).where(Completion.client_request_id.in_(slow_ids))))
        normal_rows = list(db.scalars(select(Completion).where(Completion.id.in_([normal_id, stream_id]))))
    eng.dispose()
    assert sorted(str(r.client_request_id) for r in rows) == sorted(slow_ids), "a slow call was not recorded once"
    for row in rows:
        assert row.stream and row.termination == "client_disconnected" and row.status_code == 499
        assert 0 < len(row.choices[0]["token_ids"]) < 1_000_000
    assert sorted(r.termination for r in normal_rows) == ["length", "length"]
