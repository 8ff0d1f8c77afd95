"""A throwaway Postgres cluster a test can stop and start (initdb into a temp folder, own port)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"Postgres server binaries ({name}) not found under /usr/lib/postgresql")
    return found[-1]


class PgCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="onthejob-pg-"))
        self.port = free_port()
        self.data = self.dir / "data"
        self._as_postgres = os.geteuid() == 0  # initdb refuses to run as root
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run([_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, cmd: list[str]) -> None:
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run([_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start"])

    def stop(self) -> None:
        self._run([_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def destroy(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
