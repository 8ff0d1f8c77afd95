"""What the reliability benches share: processes that die with us, closed-loop clients, reconciliation.

``bench/load.py`` (many clients for minutes), ``bench/db_outage.py`` (Postgres stopped
mid-run) and ``bench/kill_restart.py`` (the proxy SIGKILLed mid-run) all start the stub
and ``onthejob serve``, drive them with :func:`run_clients`, tally every acknowledged
``x-request-id`` and :func:`reconcile` the tally with the rows in Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx
import orjson

from bench.harness import (
    PY,
    ROOT,
    Server,
    _descendants,
    free_port,
)
from bench.loadgen import _Conn, build_request, pct

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- processes


def _die_with_parent() -> None:
    """In the child: get SIGKILL when this script dies, however it dies (no orphaned servers)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(name: str, cmd: list[str], port: int, logdir: Path, env: dict[str, str] | None = None) -> Server:
    """Start ``cmd``; it gets SIGKILL when the thread that spawned it exits, so spawn from the main thread."""
    log = logdir / f"{name}-{port}.log"
    with log.open("ab") as out:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
    return Server(name, f"http://{HOST}:{port}", port, proc, log)


def wait_ready(p: Server, ready_path: str = "/healthz", timeout_s: float = 90.0) -> Server:
    """Wait until ``ready_path`` answers below 500 (safe to call from a worker thread)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"{p.name} exited ({p.proc.returncode}): {p.log.read_text()[-3000:]}")
        try:
            if httpx.get(p.url + ready_path, timeout=2).status_code < 500:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    p.proc.kill()
    raise RuntimeError(f"{p.name} not ready after {timeout_s}s: {p.log.read_text()[-3000:]}")


def start_proc(
    name: str,
    cmd: list[str],
    port: int,
    logdir: Path,
    *,
    ready_path: str = "/healthz",
    env: dict[str, str] | None = None,
    timeout_s: float = 90.0,
) -> Server:
    """Start ``cmd`` (it dies with this script) and wait until ``ready_path`` answers below 500."""
    return wait_ready(spawn(name, cmd, port, logdir, env), ready_path, timeout_s)


def start_stub(logdir: Path) -> Server:
    port = free_port()
    return start_proc(
        "stub", [PY, "-m", "bench.stub_upstream", "--port", str(port)], port, logdir, ready_path="/v1/models"
    )


def proxy_cmd(upstream: str, db_url: str, spool: Path, port: int, workers: int = 1) -> list[str]:
    """``onthejob serve`` with auth off (it migrates the database itself); recording is on (ONTHEJOB_RECORD=1)."""
    return [
        PY,
        "-m",
        "onthejob.cli",
        "serve",
        "--upstream",
        upstream,
        "--db",
        db_url,
        "--host",
        HOST,
        "--port",
        str(port),
        "--spool",
        str(spool),
        "--no-auth",
        "--workers",
        str(workers),
    ]


def start_proxy(
    upstream: str,
    db_url: str,
    spool: Path,
    logdir: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    workers: int = 1,
) -> Server:
    port = port or free_port()
    return start_proc(
        "proxy",
        proxy_cmd(upstream, db_url, spool, port, workers),
        port,
        logdir,
        env={"ONTHEJOB_RECORD": "1", **(env or {})},
    )


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB, from /proc/<pid>/status; (0, 0) once it is gone."""
    rss = hwm = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def tree_rss_kib(pid: int) -> tuple[int, int]:
    """``rss_kib`` summed over ``pid`` and its descendants (uvicorn's workers under ``--workers N``)."""
    rss = hwm = 0
    for p in [pid, *_descendants(pid)]:
        r, h = rss_kib(p)
        rss, hwm = rss + r, hwm + h
    return rss, hwm


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_within(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, seconds: float) -> None:
    """A load script's ``main`` tail: uvloop if installed, ``run(args)`` bounded in time, its exit code."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    with bounded(seconds):
        sys.exit(run(args))


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Abort the run (with cleanup: finally blocks run) if it outlives ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the run exceeded its bound of {seconds:.0f}s; aborted")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(int(seconds) + 1)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- clients


class Conn(_Conn):
    """bench.loadgen's keep-alive connection, plus: did the stream end with [DONE]; was there an error event."""

    def _reset(self, start: float) -> None:
        super()._reset(start)
        self.last = b""
        self.error_event = False

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        window = self.last + body
        if b'{"error"' in window:
            self.error_event = True
        self.last = window[-64:]


@dataclass
class Tally:
    """What the clients saw. ``acked`` maps client request id → x-request-id for replies received in full."""

    sent: int = 0
    acked: dict[str, str] = field(default_factory=dict)
    acked_stream: int = 0
    answered: list[str] = field(default_factory=list)  # x-request-id of every answer (any status)
    failures: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    first_event_ms: list[float] = field(default_factory=list)
    t_first: float = 0.0
    t_last: float = 0.0

    @property
    def errors(self) -> int:
        return sum(self.failures.values())

    def fail(self, kind: str, detail: str) -> None:
        self.failures[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {detail}")


def body_for(stream: bool, content: str, tokens: int, gap_ms: float) -> bytes:
    body: dict[str, Any] = {
        "model": "stub-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "stream": stream,
    }
    if gap_ms:
        body["stub_gap_ms"] = gap_ms
    return orjson.dumps(body)


async def run_clients(
    port: int,
    stop: asyncio.Event,
    *,
    clients: int,
    mix: str = "stream",
    tokens: int = 16,
    gap_ms: float = 0.0,
    run_id: str = "load",
    timeout_s: float = 60.0,
    tally: Tally | None = None,
) -> Tally:
    """``clients`` closed-loop clients, one keep-alive connection each, until ``stop`` is set.

    ``mix``: "stream" (every call streamed), "json" (none), "mixed" (alternating per call).
    Each call carries ``X-Client-Request-Id: {run_id}-{client}-{n}``. A client whose
    connection fails reconnects (after 50 ms while the proxy refuses) and carries on:
    the failure is counted, never retried under the same id.
    """
    loop = asyncio.get_running_loop()
    tally = tally or Tally()
    path = "/v1/chat/completions"

    async def connect() -> Conn | None:
        try:
            _, proto = await loop.create_connection(lambda: Conn(False), HOST, port)
        except OSError as exc:
            tally.fail("connect", f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.05)
            return None
        return proto

    async def client(i: int) -> None:
        conn: Conn | None = None
        n = 0
        while not stop.is_set():
            if conn is None or conn.lost or not conn.keep_alive:
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                conn = await connect()
                if conn is None:
                    continue
            stream = mix == "stream" or (mix == "mixed" and (i + n) % 2 == 0)
            crid = f"{run_id}-{i}-{n}"
            n += 1
            payload = build_request(
                HOST,
                port,
                path,
                body_for(stream, f"client {i} call {n}", tokens, gap_ms),
                {"X-Client-Request-Id": crid},
            )
            tally.sent += 1
            try:
                s = await asyncio.wait_for(conn.request(payload, loop), timeout_s)
            except (OSError, httptools.HttpParserError, TimeoutError) as exc:
                tally.fail("timeout" if isinstance(exc, TimeoutError) else "connection", f"{type(exc).__name__}: {exc}")
                if conn.transport is not None:
                    conn.transport.close()
                conn = None
                continue
            if s.request_id:
                tally.answered.append(s.request_id)
            if s.status != 200:
                tally.fail(f"http_{s.status}", crid)
            elif stream and not conn.last.endswith(b"data: [DONE]\n\n"):
                tally.fail("stream_without_done", f"{crid}: ...{conn.last[-40:]!r}")
            elif conn.error_event:
                tally.fail("error_event", f"{crid}: ...{conn.last[-60:]!r}")
            elif not s.request_id:
                tally.fail("no_request_id", crid)
            else:
                tally.acked[crid] = s.request_id
                tally.acked_stream += stream
                tally.latency_ms.append((s.end - s.start) * 1000)
                if s.first_event is not None:
                    tally.first_event_ms.append((s.first_event - s.start) * 1000)
                tally.t_last = time.monotonic()
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    tally.t_first = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return tally


# ---------------------------------------------------------------- the database side


def rows_of(db_url: str) -> list[tuple[str, str | None, int, str]]:
    """(id, client_request_id, status_code, termination) of every completion row."""
    import psycopg

    with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return [
            tuple(r)
            for r in conn.execute(  # type: ignore[misc]
                "SELECT id, client_request_id, status_code, termination FROM completions"
            )
        ]


@dataclass
class Reconciled:
    acked: int
    recorded: int  # acknowledged calls with a row
    missing: list[str]  # acknowledged (x-request-id) without a row
    duplicated: int  # client request ids with more than one row
    unacked_rows: int  # rows no client saw in full (cut by a kill, error answers, ...)
    rows: int
    terminations: Counter[str]


def reconcile(tally: Tally, db_url: str) -> Reconciled:
    rows = rows_of(db_url)
    by_id = {r[0] for r in rows}
    per_crid = Counter(r[1] for r in rows if r[1] is not None)
    acked_ids = set(tally.acked.values())
    missing = sorted(acked_ids - by_id)
    return Reconciled(
        acked=len(acked_ids),
        recorded=len(acked_ids & by_id),
        missing=missing,
        duplicated=sum(1 for c in per_crid.values() if c > 1) + (len(rows) - len(by_id)),
        unacked_rows=len(by_id - acked_ids),
        rows=len(rows),
        terminations=Counter(r[3] for r in rows),
    )


def percentiles(values: list[float]) -> str:
    return "p50 {:.1f} / p90 {:.1f} / p99 {:.1f} / max {:.1f} ms".format(
        pct(values, 50), pct(values, 90), pct(values, 99), max(values, default=float("nan"))
    )
