"""Proxy fixtures: the real `onthejob serve` in a subprocess, in front of a real engine or a stub."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.keys import create_key
from storage.models import Adapter
from storage.models.training import ADAPTER_COMMITTED
from tests.conftest import free_port


@dataclass
class Proxy:
    url: str
    proc: subprocess.Popen[bytes]
    spool: Path
    log: Path
    db_url: str

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    def stop(self, sig: str = "term") -> int:
        """Stop the proxy. SIGTERM may take up to its own bounds: in-flight calls 30 s, then the
        housekeeping thread 10 s and the last drain 10 s (proxy/state.py), inside uvicorn's 30 s grace;
        a loaded CI machine once passed a 30 s wait here. Past 90 s it is a hang: killed, and the
        log's tail is the error."""
        if self.proc.poll() is None:
            (self.proc.terminate if sig == "term" else self.proc.kill)()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"proxy did not stop in 90 s: {self.log.read_text()[-3000:]}") from None
        return self.proc.returncode

    def wait_drained(self, timeout: float = 30.0) -> None:
        """Poll /readyz until the spool is empty (the recorder committed everything)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = httpx.get(f"{self.url}/readyz", timeout=10).json()
            if body["spool"]["depth"] == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"spool not drained after {timeout}s: {body}")


ProxyFactory = Callable[..., Proxy]


def launch_proxy(
    folder: Path,
    upstream: str,
    db_url: str,
    *,
    auth: bool = False,
    env: dict[str, str] | None = None,
    spool: Path | None = None,
    port: int | None = None,
    workers: int = 1,
) -> Proxy:
    """The real `onthejob serve` in a subprocess (spool and log under ``folder``), once /healthz answers."""
    port = port or free_port()
    spool = spool or folder / f"spool-{port}"
    log = folder / f"proxy-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "onthejob.cli",
        "serve",
        "--upstream",
        upstream,
        "--db",
        db_url,
        "--port",
        str(port),
        "--spool",
        str(spool),
        "--workers",
        str(workers),
    ]
    if not auth:
        cmd.append("--no-auth")
    with log.open("ab") as out:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"proxy exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return Proxy(url, proc, spool, log, db_url)


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[ProxyFactory]:
    started: list[Proxy] = []

    def start(upstream: str, db_url: str, **options: Any) -> Proxy:
        proxy = launch_proxy(tmp_path, upstream, db_url, **options)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def metric_sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one Prometheus sample with exactly these labels in an exposition, or None."""
    want = sorted(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric == name and sorted(filter(None, rest.rstrip("}").split(","))) == want:
            return float(value)
    return None


def make_key(db_url: str, project: str = "default", role: str = "harness") -> str:
    eng = sync_engine(db_url)
    with Session(eng) as db:
        key = create_key(db, project, role)
        db.commit()
    eng.dispose()
    return key.secret


def add_adapter(
    db_url: str,
    project: str,
    alias: str,
    version: int,
    path: Path | str,
    base_model: str,
    state: str = ADAPTER_COMMITTED,
) -> None:
    """An adapter row written straight to the database, as a trainer's publish leaves one (no weights checked)."""
    eng = sync_engine(db_url)
    with Session(eng) as db:
        db.add(
            Adapter(
                project_id=project,
                alias=alias,
                version=version,
                path=str(path),
                sha256="0" * 64,
                base_model=base_model,
                state=state,
            )
        )
        db.commit()
    eng.dispose()


@contextlib.contextmanager
def stub_engine(log: Path) -> Iterator[str]:
    """The fault-injecting fake engine (bench.stub_upstream) on a free port, logging to ``log``, once it
    answers; killed on exit."""
    port = free_port()
    # bench/ is test and bench equipment, not an installed package: run it from the checkout.
    with log.open("ab") as out:  # the child holds its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.stub_upstream", "--port", str(port)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def stub_upstream(tmp_path: Path) -> Iterator[str]:
    """The fault-injecting fake engine (bench.stub_upstream) on a free port."""
    with stub_engine(tmp_path / "stub.log") as url:
        yield url
