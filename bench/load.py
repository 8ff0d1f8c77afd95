"""Load: 200 concurrent streaming clients against the recording proxy for 5 minutes (issue 7).

Starts the stub upstream and ``onthejob serve`` (recording on, a throwaway Postgres
database on 127.0.0.1:5432 created here and dropped at the end), runs ``--clients``
closed-loop streaming clients for ``--duration`` seconds, then waits for the spool
to drain and prints:

- errors (must be 0): connection failures, non-200 answers, streams that did not end
  with ``data: [DONE]`` or carried an error event;
- requests (and requests/s, latency and time-to-first-event percentiles);
- the proxy's RSS (``VmRSS`` from ``/proc/<pid>/status``) at start, a few samples
  during the run, and at the end;
- records == responses: the ``x-request-id`` of every completed response against the
  rows of ``completions`` once the spool is empty (missing, extra, duplicated).

Reading RSS: the proxy keeps a bounded in-memory cache of session link keys
(``proxy.sessions.LinkCache``, 100,000 entries, about 0.5 KB each here), and every
call of this load adds one, so RSS climbs by up to ~50-70 MiB over the first
~100,000 calls and should then stay flat; growth past that is a leak.

Everything listens on 127.0.0.1 only; every process it starts dies with it, and the
whole run is bounded (``--duration`` + drain timeout + a margin). Exit status 0 only
when errors == 0 and records == responses.

Run: ``.venv/bin/python -m bench.load`` (``--duration 30`` for a quick check).

The client machinery here (``run_clients``, ``start_proc``, ``rows_of``) is shared by
``bench/db_outage.py`` and ``bench/kill_restart.py``.
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
import tempfile
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
    machine_description,
    throwaway_database,
    wait_spool_empty,
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
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)  # noqa: PLW1509  # fmt: skip
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
    return start_proc("stub", [PY, "-m", "onthejob.stub_upstream", "--port", str(port)], port, logdir,
                      ready_path="/v1/models")  # fmt: skip


def proxy_cmd(upstream: str, db_url: str, spool: Path, port: int, workers: int = 1) -> list[str]:
    """``onthejob serve`` with auth off (it migrates the database itself); recording is on (ONTHEJOB_RECORD=1)."""
    return [PY, "-m", "onthejob.cli", "serve", "--upstream", upstream, "--db", db_url, "--host", HOST,
            "--port", str(port), "--spool", str(spool), "--no-auth", "--workers", str(workers)]  # fmt: skip


def start_proxy(upstream: str, db_url: str, spool: Path, logdir: Path, port: int | None = None,
                env: dict[str, str] | None = None, workers: int = 1) -> Server:  # fmt: skip
    port = port or free_port()
    return start_proc("proxy", proxy_cmd(upstream, db_url, spool, port, workers), port, logdir,
                      env={"ONTHEJOB_RECORD": "1", **(env or {})})  # fmt: skip


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
    body: dict[str, Any] = {"model": "stub-model", "messages": [{"role": "user", "content": content}],
                            "max_tokens": tokens, "stream": stream}  # fmt: skip
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
            payload = build_request(HOST, port, path, body_for(stream, f"client {i} call {n}", tokens, gap_ms),
                                    {"X-Client-Request-Id": crid})  # fmt: skip
            tally.sent += 1
            try:
                s = await asyncio.wait_for(conn.request(payload, loop), timeout_s)
            except (OSError, httptools.HttpParserError, TimeoutError) as exc:
                tally.fail("timeout" if isinstance(exc, TimeoutError) else "connection",
                           f"{type(exc).__name__}: {exc}")  # fmt: skip
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
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            "SELECT id, client_request_id, status_code, termination FROM completions")]  # fmt: skip


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


# ---------------------------------------------------------------- the load run


async def _load(args: argparse.Namespace, proxy: Server) -> tuple[Tally, list[tuple[float, int, int]]]:
    stop = asyncio.Event()
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()

    async def sampler() -> None:
        interval = max(1.0, args.duration / args.rss_samples)
        while not stop.is_set():
            samples.append((time.monotonic() - t0, *tree_rss_kib(proxy.proc.pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    asyncio.get_running_loop().call_later(args.duration, stop.set)
    sampling = asyncio.create_task(sampler())
    tally = await run_clients(proxy.port, stop, clients=args.clients, mix="stream", tokens=args.tokens,
                              gap_ms=args.gap_ms, run_id="load")  # fmt: skip
    await sampling
    samples.append((time.monotonic() - t0, *tree_rss_kib(proxy.proc.pid)))
    return tally, samples


def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine_description()}")
    print(f"load: {args.clients} streaming clients for {args.duration:.0f} s; stub: {args.tokens} tokens a reply, "
          f"{args.gap_ms} ms between chunks; recording on (Postgres 127.0.0.1:5432, throwaway database)")  # fmt: skip
    sys.stdout.flush()
    with tempfile.TemporaryDirectory(prefix="onthejob-load-") as tmp, throwaway_database() as db_url:
        logdir = Path(tmp)
        stub = start_stub(logdir)
        proxy = None
        try:
            proxy = start_proxy(stub.url, db_url, logdir / "spool", logdir, workers=args.workers)
            rss_idle = tree_rss_kib(proxy.proc.pid)[0]
            tally, samples = asyncio.run(_load(args, proxy))
            load_end = loadavg()
            t = time.monotonic()
            drained = True
            try:
                wait_spool_empty(proxy.url, timeout_s=args.drain_timeout)
            except RuntimeError as exc:
                drained = False
                print(f"!! {exc}")
            drain_s = time.monotonic() - t
            rec = reconcile(tally, db_url)
            rss_drained = tree_rss_kib(proxy.proc.pid)[0]
            alive = proxy.proc.poll() is None
        finally:
            if proxy is not None:
                proxy.stop()
            stub.stop()

    wall = max(tally.t_last - tally.t_first, 1e-9)
    responses = tally.sent - sum(v for k, v in tally.failures.items() if k in ("connection", "timeout"))
    print()
    print(f"requests sent        {tally.sent}")
    print(f"responses in full    {len(tally.acked)}  ({len(tally.acked) / wall:.0f}/s over {wall:.0f} s)")
    print(f"errors               {tally.errors}  {dict(tally.failures) or ''}")
    for example in tally.examples:
        print(f"   e.g. {example}")
    print(f"latency (full reply) {percentiles(tally.latency_ms)}")
    print(f"first event          {percentiles(tally.first_event_ms)}")
    print(f"load average         {load_end} at the end of the load")
    print()
    print(f"proxy RSS (VmRSS; VmHWM = peak so far; {args.workers} worker(s), summed over the process tree)")
    print(f"   before load        {rss_idle / 1024:7.1f} MiB")
    for at, rss, hwm in samples:
        print(f"   t={at:6.1f} s         {rss / 1024:7.1f} MiB   (HWM {hwm / 1024:.1f} MiB)")
    print(f"   after the drain    {rss_drained / 1024:7.1f} MiB")
    first_loaded = samples[1][1] if len(samples) > 2 else samples[0][1]
    print(f"   growth from the first loaded sample to the end: {(samples[-1][1] - first_loaded) / 1024:+.1f} MiB")
    print()
    print(
        f"spool drained in     {drain_s:.1f} s after the load stopped"
        if drained
        else f"spool NOT drained after {drain_s:.0f} s"
    )
    print(f"responses            {responses}  (every answer the clients received, any status)")
    print(f"rows in completions  {rec.rows}  terminations {dict(rec.terminations)}")
    print(f"acknowledged         {rec.acked}; recorded {rec.recorded}; missing {len(rec.missing)}; "
          f"duplicated {rec.duplicated}; rows no client saw in full {rec.unacked_rows}")  # fmt: skip
    if rec.missing:
        print(f"   missing e.g. {rec.missing[:5]}")
    equal = rec.rows == responses and not rec.missing and rec.duplicated == 0
    print(f"records == responses {'yes' if equal else 'NO'} ({rec.rows} == {responses})")
    print(f"proxy alive at end   {alive}")
    ok = tally.errors == 0 and equal and alive and drained
    print("RESULT: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens a reply (one SSE chunk each)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="stub gap between chunks")
    parser.add_argument("--workers", type=int, default=1, help="onthejob serve --workers (RSS is summed over them)")
    parser.add_argument("--rss-samples", type=int, default=6, help="RSS samples during the load")
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    args = parser.parse_args()
    run_within(run, args, args.duration + args.drain_timeout + 300)


if __name__ == "__main__":
    main()
