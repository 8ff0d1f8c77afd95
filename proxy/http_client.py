"""The upstream HTTP/1.1 client: keep-alive connections per engine, responses parsed by httptools.

Built for the proxy's one hot path, a JSON POST to an engine whose reply is read whole or
forwarded as it streams. aiohttp's client spent ~125 µs of CPU a call doing that here, this one
~40 (bench/journal/2026-12-02.md, "Issue 21: the upstream client, our own"). It does only what
an engine needs: no redirects, cookies, proxies or compression (it asks for none), no HTTP/2, no
pipelining.

Timeouts: connect, and idle (no byte for that long while a reader waits, the first byte of the
reply included); never a total timeout on a stream (the callers add one where they want it).
A pooled connection the engine closed while idle is dropped when the close arrives; a reused
connection that closes before a single byte of the reply came is retried once on a new one (the
engine never read that request).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

# A pooled connection idle this long is closed rather than reused: below the 5 s keep-alive of
# vLLM's server (uvicorn), so the engine never closes one just as a request goes out on it.
KEEPALIVE_S = 4.0
# Reading from an engine pauses while this much of its reply waits for the caller to take it.
HIGH_WATER = 1 << 20


class UpstreamConnectError(OSError):
    """No connection could be made (refused, unreachable, unknown host, connect timeout)."""


class UpstreamIdleTimeout(TimeoutError):
    """Connected, then no byte came within the idle timeout."""


class UpstreamDisconnected(ConnectionError):
    """The connection closed or broke before the reply ended, or the reply was not HTTP."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection, carrying one request at a time."""

    def __init__(self, pool: HttpClient, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.key, self.loop = pool, key, loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.buffered = 0
        self.received = 0  # bytes of the current reply
        self.headers_done = self.complete = self.lost = self.paused = self.release_at_end = self.keep_alive = False
        self.error: BaseException | None = None
        self.idle_since = 0.0

    # ---- the request -----------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.body, self.buffered, self.received = 0, {}, [], 0, 0
        self.headers_done = self.complete = self.release_at_end = self.keep_alive = False
        self.error = None
        assert self.transport is not None
        self.transport.write(data)

    async def wait(self, timeout: float) -> None:
        """Until something arrives or the connection ends. Raises the reply's error when it has one, and
        UpstreamIdleTimeout after ``timeout`` idle."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take(self) -> bytes:
        """The reply's bytes received and not yet taken."""
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body, self.buffered = [], 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def release(self) -> None:
        """The caller is done: back to the pool once the reply has ended, closed if it cannot end cleanly."""
        if self.complete:
            self._reuse()
        elif self.error is None and not self.lost and self.headers_done:
            self.release_at_end = True  # e.g. a stream's last chunk terminator still on its way
            self.take()  # dropped, and reading resumed if the buffer had paused it
        else:
            self.abort()

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def _reuse(self) -> None:
        self.parser = None
        if self.keep_alive and not self.lost:
            self.idle_since = time.monotonic()
            self.pool._idle.setdefault(self.key, []).append(self)
        else:
            self.abort()

    # ---- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):  # not TCP (a test's socket pair)
                pass

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # bytes on an idle connection: nothing to do with them
            self.abort()
            return
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = UpstreamDisconnected(f"the engine's reply is not valid HTTP: {exc}")
            self.abort()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool._forget(self)
        if self.parser is not None and not self.complete and self.error is None:
            if self.headers_done and "content-length" not in self.headers and "transfer-encoding" not in self.headers:
                self.complete = True  # a reply delimited by the close itself
            else:
                what = f"{type(exc).__name__}: {exc}" if exc else "the engine closed the connection"
                self.error = UpstreamDisconnected(f"{what} before the reply ended")
        self._wake()

    # ---- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # read here: the parser forgets it at the message's end
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.release_at_end:
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        if self.release_at_end:
            self._reuse()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamIdleTimeout("no byte from the engine within the idle timeout"))


class UpstreamResponse:
    """A reply whose headers have arrived; its body is read with :meth:`read` or :meth:`chunks`."""

    def __init__(self, conn: _Connection, idle_timeout: float) -> None:
        self._conn = conn
        self._idle = idle_timeout
        self.status = conn.status
        self.headers = conn.headers  # names in lower case
        self._done = False

    async def read(self) -> bytes:
        """The whole body (the connection goes back to the pool)."""
        conn = self._conn
        parts: list[bytes] = []
        try:
            while not conn.complete:
                if conn.buffered > HIGH_WATER:
                    parts.append(conn.take())  # reading paused at the high-water mark: take it, so it resumes
                await conn.wait(self._idle)
        except BaseException:
            self.close()
            raise
        parts.append(conn.take())
        self.release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: what each wait brought, in one piece."""
        conn = self._conn
        while True:
            if conn.buffered:
                yield conn.take()
            elif conn.complete:
                return
            else:
                await conn.wait(self._idle)

    def release(self) -> None:
        """Done with it: the connection is reused once the reply has ended (else closed)."""
        if not self._done:
            self._done = True
            self._conn.release()

    def close(self) -> None:
        """Done with it and the connection closed (the engine sees the disconnect: vLLM aborts the request)."""
        if not self._done:
            self._done = True
            self._conn.abort()


class HttpClient:
    """Keep-alive connections to the engines, and requests over them."""

    def __init__(self, connect_timeout: float, idle_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._heads: dict[tuple[str, str, str], tuple[tuple[str, str, int], bytes]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self, method: str, base: str, path: str, body: bytes | None = None, idle_timeout: float | None = None
    ) -> UpstreamResponse:
        """Send one request; return once the reply's headers are in (its body unread)."""
        target = self._heads.get((method, base, path))
        if target is None:  # the request line and fixed headers, built once per engine and route
            target = self._heads[(method, base, path)] = _head(method, base, path)
        key, head = target
        data = head + (b"content-length: %d\r\n\r\n%s" % (len(body), body) if body is not None else b"\r\n")
        idle = self.idle_timeout if idle_timeout is None else idle_timeout
        pooled = self._pooled(key)
        if pooled is not None:
            try:
                return await _exchange(pooled, data, idle)
            except UpstreamDisconnected:
                if pooled.received:
                    raise
                # Closed before one byte of the reply: the engine closed it while idle and never read
                # this request. Once more, on a new connection.
        return await _exchange(await self._connect(key), data, idle)

    def _pooled(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now, loop = time.monotonic(), asyncio.get_running_loop()
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if (
                not conn.lost
                and now - conn.idle_since < KEEPALIVE_S
                and conn.loop is loop
                and transport is not None
                and not transport.is_closing()
            ):
                return conn
            if conn.loop is loop:
                conn.abort()  # (one from another event loop, closed since, is left to be collected)
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self, key, loop), host, port, ssl=context)
        except TimeoutError as exc:
            raise UpstreamConnectError(f"connecting to {host}:{port} timed out after {self.connect_timeout}s") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return conn

    def _forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for idle in self._idle.values():
            for conn in idle:
                if conn.loop is loop:
                    conn.abort()
        self._idle.clear()


async def _exchange(conn: _Connection, data: bytes, idle: float) -> UpstreamResponse:
    """Send one request on ``conn``; the reply once its headers are in (the connection closed on failure)."""
    conn.send(data)
    try:
        while not conn.headers_done:
            await conn.wait(idle)
    except BaseException:
        conn.abort()
        raise
    return UpstreamResponse(conn, idle)


def _head(method: str, base: str, path: str) -> tuple[tuple[str, str, int], bytes]:
    url = urlsplit(base)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"not an http(s) URL: {base!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    host = url.hostname if ":" not in url.hostname else f"[{url.hostname}]"
    full = (url.path.rstrip("/") + path) or "/"
    head = f"{method} {full} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
    return (url.scheme, url.hostname, port), head.encode("latin-1")
