"""A closed-loop HTTP/1.1 load generator cheap enough not to be the bottleneck on 2 cores.

Each of ``concurrency`` workers owns one keep-alive connection (an asyncio
Protocol fed to httptools' C parser) and sends the same pre-built request again
and again. aiohttp's client costs roughly 3-5x more CPU per request than this,
which on a 2-core machine would cap what any peer can show. Per request it keeps
the start and end time, the status, the ``x-request-id`` header, the arrival of
the first SSE ``data:`` event, and (when asked) the arrival of every event, for
streaming-fidelity gaps.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httptools

perf = time.perf_counter


@dataclass
class Sample:
    start: float
    end: float
    status: int
    request_id: str | None
    first_event: float | None  # arrival of the first SSE data event (None: not streamed)
    events: list[float] | None  # arrival of every SSE data event (only when asked)


@dataclass
class LoadResult:
    concurrency: int
    duration_s: float  # length of the measurement window
    samples: list[Sample] = field(default_factory=list)  # requests started inside the window
    completed_in_window: int = 0
    total_done: int = 0  # every response, warm-up included (for CPU per request)
    errors: int = 0
    all_ids: list[str] = field(default_factory=list)  # every x-request-id seen, warm-up included
    error_examples: list[str] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.completed_in_window / self.duration_s if self.duration_s else 0.0

    def latencies_ms(self) -> list[float]:
        return [(s.end - s.start) * 1000 for s in self.samples if s.status == 200]

    def ttfb_ms(self) -> list[float]:
        return [(s.first_event - s.start) * 1000 for s in self.samples if s.status == 200 and s.first_event]

    def gaps_ms(self) -> list[float]:
        """Delivered gaps between consecutive timestamped SSE events of each stream."""
        out: list[float] = []
        for s in self.samples:
            ev = s.events or []
            out += [(b - a) * 1000 for a, b in zip(ev, ev[1:], strict=False)]
        return out


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self, want_events: bool, marker: bytes | None = None) -> None:
        self.want_events = want_events
        self.marker = marker
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Sample] | None = None
        self.lost = False
        self._reset(0.0)

    def _reset(self, start: float) -> None:
        self.start = start
        self.rid: str | None = None
        self.first: float | None = None
        self.events: list[float] | None = [] if self.want_events else None
        self.tail = b""
        self.keep_alive = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(exc or ConnectionResetError("connection closed"))

    def _fail(self, exc: BaseException) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"x-request-id":
            self.rid = value.decode()

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        now = perf()
        # SSE: count complete "data:" events in this piece (events end with a blank line).
        buf = self.tail + body
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.tail = buf
            return
        complete, self.tail = buf[: cut + 2], buf[cut + 2 :]
        n = complete.count(b"data:") - complete.count(b"data: [DONE]")
        if n > 0:
            if self.first is None:
                self.first = now
            if self.events is not None:
                if self.marker is not None:  # only events that carry a token, e.g. b'"x"'
                    n = sum(1 for event in complete.split(b"\n\n") if self.marker in event)
                self.events.extend([now] * n)

    def on_message_complete(self) -> None:
        sample = Sample(self.start, perf(), self.parser.get_status_code(), self.rid, self.first, self.events)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(sample)

    async def request(self, payload: bytes, loop: asyncio.AbstractEventLoop) -> Sample:
        assert self.transport is not None
        if self.transport.is_closing():  # the server died since the last reply (uvloop raises RuntimeError)
            raise ConnectionResetError("the connection was closed by the server")
        self.waiter = loop.create_future()
        self._reset(perf())
        self.transport.write(payload)
        return await self.waiter


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Accept: */*",
    ]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def run_load(
    host: str,
    port: int,
    payload: bytes,
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.5,
    want_events: bool = False,
    marker: bytes | None = None,
) -> LoadResult:
    """Keep ``concurrency`` requests in flight for warm-up plus ``duration_s``; measure the window after warm-up."""
    loop = asyncio.get_running_loop()
    t0 = perf()
    w_start, w_end = t0 + warmup_s, t0 + warmup_s + duration_s
    result = LoadResult(concurrency, duration_s)

    async def connect() -> _Conn:
        _, proto = await loop.create_connection(lambda: _Conn(want_events, marker), host, port)
        return proto

    async def worker() -> None:
        conn = await connect()
        while perf() < w_end:
            try:
                s = await conn.request(payload, loop)
            except (OSError, httptools.HttpParserError) as exc:
                result.errors += 1
                if len(result.error_examples) < 3:
                    result.error_examples.append(f"{type(exc).__name__}: {exc}")
                conn = await connect()
                continue
            result.total_done += 1
            if s.request_id:
                result.all_ids.append(s.request_id)
            if s.status != 200:
                result.errors += 1
                if len(result.error_examples) < 3:
                    result.error_examples.append(f"HTTP {s.status}")
            if w_start <= s.start < w_end:
                result.samples.append(s)
            if w_start <= s.end < w_end and s.status == 200:
                result.completed_in_window += 1
            if not conn.keep_alive or conn.lost:
                if conn.transport is not None:
                    conn.transport.close()
                conn = await connect()
        if conn.transport is not None:
            conn.transport.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return result


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]
