"""What both benchmarks share: starting peers as subprocesses, CPU accounting, a throwaway Postgres.

CPU split on a 2-core machine (``--pin``, the default): the server under test
(proxy, pass-through or LiteLLM) gets core 1 to itself; the load generator (this
process) and the stub upstream share core 0. Postgres and everyone else's work
float. The direct-to-stub rows show what core 0 can push: while a peer's rate
stays below that, the peer, not the load generator, is the bottleneck.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from bench.loadgen import pct

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` started one later each round: the slot in a round favours whoever takes it on this
    machine (up to ~12%, bench/RESULTS.md), so over len(items) rounds each takes each slot once."""
    k = round_index % len(items) if items else 0
    return [*items[k:], *items[:k]]


def pin_self(cores: set[int] | None) -> None:
    if cores is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


@dataclass
class Server:
    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server and all its descendants (workers), so far."""
        return sum(proc_cpu(pid) for pid in [self.proc.pid, *_descendants(self.proc.pid)])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_server(
    name: str,
    cmd: list[str],
    port: int,
    logdir: Path,
    *,
    ready_path: str = "/healthz",
    env: dict[str, str] | None = None,
    cores: set[int] | None = None,
    timeout_s: float = 90.0,
    cwd: Path = ROOT,
) -> Server:
    """Start ``cmd`` (pinned to ``cores``, in ``cwd``: ``python -m`` imports from there first) and wait
    until ``ready_path`` answers below 500."""
    log = logdir / f"{name}-{port}.log"
    pre = None
    if cores is not None:
        wanted = set(cores)

        def pre() -> None:
            os.sched_setaffinity(0, wanted)

    with log.open("ab") as out:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=pre,  # noqa: PLW1509 - only sets CPU affinity
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code < 500:
                return Server(name, url, port, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{name} not ready after {timeout_s}s: {log.read_text()[-3000:]}")


def stat_cpu(stat: Path) -> tuple[float, float]:
    """(user, system) CPU seconds from a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat`` file;
    (0, 0) when it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    return int(fields[11]) / CLK, int(fields[12]) / CLK  # utime, stime


def proc_cpu(pid: int) -> float:
    """CPU seconds so far of one process (user + system)."""
    return sum(stat_cpu(Path(f"/proc/{pid}/stat")))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@contextlib.contextmanager
def throwaway_database(admin_url: str = "postgresql://postgres@127.0.0.1:5432/postgres") -> Iterator[str]:
    """A fresh Postgres database for this run, dropped afterwards; yields its URL."""
    import psycopg

    name = f"onthejob_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def count_rows(db_url: str, ids: list[str]) -> int:
    """How many of ``ids`` are rows of ``completions``."""
    import psycopg

    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM completions WHERE id = ANY(%s)", (ids,)).fetchone()
    return int(row[0]) if row else 0


def wait_spool_empty(proxy_url: str, timeout_s: float = 60.0) -> float:
    """Poll the proxy's /readyz until its spool depth is 0; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            depth = httpx.get(f"{proxy_url}/readyz", timeout=10).json()["spool"]["depth"]
        except (httpx.HTTPError, KeyError, ValueError):
            depth = -1
        if depth == 0:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise RuntimeError(f"spool of {proxy_url} not empty after {timeout_s}s")


def wait_rows(db_url: str, ids: list[str], timeout_s: float = 60.0, settle_s: float = 10.0) -> int:
    """Rows of ``ids`` in Postgres once all have landed, or once the count stopped growing for ``settle_s``.

    Works for any number of proxy workers (each drains its own spool folder; /readyz
    answers for one of them only).
    """
    t0 = last_change = time.monotonic()
    seen = -1
    while True:
        landed = count_rows(db_url, ids)
        now = time.monotonic()
        if landed == len(ids) or now - t0 > timeout_s or now - last_change > settle_s:
            return landed
        if landed != seen:
            seen, last_change = landed, now
        time.sleep(0.2)


def fsync_probe(folder: Path, n: int = 200) -> tuple[float, float]:
    """p50 and p99 of one append + fsync of a 3 kB line on the spool's disk, now (ms)."""
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 3000 + b"\n")
            t = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return pct(times, 50), pct(times, 99)


def machine_description() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, IndexError, ValueError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024**2:.0f} GiB RAM"
    load = ""
    with contextlib.suppress(OSError):
        load = ", load average at start " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"{CORES} cores ({model}){mem}, Linux {os.uname().release}, Python {sys.version.split()[0]}{load}"
