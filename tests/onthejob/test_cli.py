from __future__ import annotations

import subprocess
import sys

COMMANDS = ["engine", "serve", "train", "deploy", "demo", "db", "keys", "export"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onthejob.cli", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_command() -> None:
    out = _cli("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert f"    {name}" in out.stdout


def test_engine_with_a_missing_model_says_so_in_one_line() -> None:
    out = _cli("engine", "--model", "/nonexistent")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "/nonexistent" in lines[0] and "no such folder" in lines[0]
