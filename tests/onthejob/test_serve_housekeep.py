"""``serve`` runs the housekeeping as a process of its own, gone when serve is, killed or not."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import free_port


def _serve(db_url: str, spool: Path, *flags: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "onthejob.cli", "serve", "--db", db_url, "--port", str(free_port())]
    cmd += ["--spool", str(spool), "--no-auth", "--upstream", "http://127.0.0.1:9", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _housekeeper(serve: subprocess.Popen[bytes]) -> psutil.Process:
    """Wait (up to 60 s) for serve's `onthejob housekeep` child to appear."""
    parent = psutil.Process(serve.pid)
    for _ in range(600):
        for child in parent.children():
            if "housekeep" in child.cmdline():
                return child
        assert serve.poll() is None, "serve ended before starting its housekeeper"
        psutil.wait_procs([parent], timeout=0.1)
    raise AssertionError("serve started no housekeeping process")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_housekeeping_process_ends_with_serve(pg_factory: Any, tmp_path: Path, sig: signal.Signals) -> None:
    serve = _serve(pg_factory(), tmp_path / "spool")
    try:
        keeper = _housekeeper(serve)
        assert "--until-stdin-closes" in keeper.cmdline()
        serve.send_signal(sig)
        serve.wait(60)
        gone, alive = psutil.wait_procs([keeper], timeout=30)
        assert keeper in gone and not alive, "the housekeeping process outlived serve"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)


def test_no_housekeep_starts_none(pg_factory: Any, tmp_path: Path) -> None:
    serve = _serve(pg_factory(), tmp_path / "spool", "--no-housekeep")
    try:
        parent = psutil.Process(serve.pid)
        # Until serve answers on /readyz its children would already be there; the spool appears after start.
        for _ in range(600):
            if (tmp_path / "spool").exists() or serve.poll() is not None:
                break
            psutil.wait_procs([parent], timeout=0.1)
        assert serve.poll() is None
        assert not [c for c in parent.children() if "housekeep" in c.cmdline()]
    finally:
        serve.terminate()
        serve.wait(30)
