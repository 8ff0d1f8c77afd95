"""Claude Code and Codex, installed from npm and run in their default modes, through the proxy to a real engine.

The engine serves the long-context tiny model (SmolLM2's tokenizer, 60k context: a CLI's
~20k-token default request fits). Each CLI runs twice, the second time continuing the first
conversation (``claude -p --continue``, ``codex exec resume --last``), each run within 90 s
and exiting 0. Between the proxy and the engine a tap keeps what the engine returned: every
call the engine answered is recorded, with the prompt and sampled token ids the engine
returned; the main loop's calls (the ones carrying the CLI's tools) are one session, one
trajectory whose sampled tokens are the engine's; feedback posted to it attaches and is its
reward. Every call is tagged with the CLI and the CLI's own session id, a call without the
CLI's tools as a side call (proxy/link_keys.py harness_tags). Nothing tries to leave the
machine: an HTTP(S) proxy trap given to the CLIs for every other address sees no connection.

Without npm or its registry the test skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.launcher import Engine
from tests.harness.clis import NpmUnavailable, claude_env, codex_env, ensure_installed
from tests.harness.tap import EngineTap, OutboundTrap
from tests.proxy.conftest import Proxy, launch_proxy

pytestmark = [pytest.mark.engine, pytest.mark.slow]

RUN_TIMEOUT = 90  # seconds a CLI run may take; a bound on the subprocess, never an assertion on time


@pytest.fixture(scope="session")  # session, as the engine is: installed (or failed) before it starts
def cli_bin() -> Path:
    try:
        return ensure_installed()
    except (NpmUnavailable, subprocess.TimeoutExpired, OSError) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the CLIs could not be installed from npm: {exc}")
        pytest.skip(f"the CLIs could not be installed from npm: {exc}")


@pytest.fixture
def tap(tiny_long_engine: Engine) -> Iterator[EngineTap]:
    tap = EngineTap(tiny_long_engine.url).start()
    yield tap
    tap.stop()


@pytest.fixture
def trap() -> Iterator[OutboundTrap]:
    trap = OutboundTrap()
    yield trap
    trap.close()


@pytest.fixture
def proxy(tap: EngineTap, pg_factory: Any, tmp_path: Path) -> Iterator[Proxy]:
    """The proxy on a database of its own, so every record in it is from this test's runs."""
    proxy = launch_proxy(tmp_path, tap.url, pg_factory())
    yield proxy
    proxy.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("The build is green. Next: write the release notes.\n")
    return work


def run_cli(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        cmd,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{cmd[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def recorded_exactly(proxy: Proxy, tap: EngineTap, dialect: str) -> list[dict[str, Any]]:
    """Every call the engine answered is recorded, with the token ids the engine returned; the records."""
    proxy.wait_drained()
    records = httpx.get(f"{proxy.v1}/chat/completions", params={"limit": 500}, timeout=30).json()["data"]
    served = tap.posts("/v1/chat/completions")
    assert served and all(call.status == 200 for call in served), [call.status for call in served]
    assert len(records) == len(served), (len(records), len(served))
    for rec in records:
        capture = rec["onthejob"]
        assert capture["dialect"] == dialect and capture["status_code"] == 200, capture
        assert capture["prompt_token_ids"] and capture["completion_token_ids"][0], rec["id"]
    got = sorted(
        (tuple(r["onthejob"]["prompt_token_ids"]), tuple(r["onthejob"]["completion_token_ids"][0])) for r in records
    )
    sampled = sorted((tuple(c.prompt_token_ids or ()), tuple(c.token_ids.get(0, ()))) for c in served)
    assert got == sampled, "the recorded token ids differ from what the engine returned"
    return list(records)


def main_loop_session(records: list[dict[str, Any]], tool_key: str) -> str:
    """The one session of the calls that carry the CLI's tools (its agent loop); the others are side calls."""
    main = [r for r in records if (r["onthejob"]["client_request"] or {}).get(tool_key)]
    assert len(main) >= 2, "both runs' main-loop calls must be recorded"
    sessions = {r["onthejob"]["session_id"] for r in main}
    assert len(sessions) == 1, f"the main loop must link into one session, got {sessions}"
    return str(sessions.pop())


def tagged_by_harness(records: list[dict[str, Any]], harness: str, tool_key: str) -> None:
    """Every call names the harness and its own session id; a call without the CLI's tools is tagged a side call."""
    for rec in records:
        tags = rec["onthejob"]["tags"]
        assert f"harness:{harness}" in tags, tags
        assert any(t.startswith(("claude-code-session:", "codex-thread:")) for t in tags), tags
        if harness == "claude-code":  # Codex marks its side calls in a header (tests/proxy/test_harness_tags.py)
            side = not (rec["onthejob"]["client_request"] or {}).get(tool_key)
            assert ("side-call" in tags) == side, (tags, side)
        elif (rec["onthejob"]["client_request"] or {}).get(tool_key):
            assert "side-call" not in tags, tags


def feedback_attaches(proxy: Proxy, session: str) -> None:
    fb = httpx.post(
        f"{proxy.v1}/feedback",
        json={"target": {"session_id": session}, "name": "reward", "value": 1.0, "id": "cli-run-1"},
        timeout=10,
    )
    assert fb.status_code == 201 and fb.json()["status"] == "attached", fb.text
    listed = httpx.get(f"{proxy.v1}/feedback", params={"session_id": session}, timeout=10).json()["data"]
    assert [item["id"] for item in listed] == [fb.json()["id"]], listed


def one_token_exact_trajectory(proxy: Proxy, session: str, records: list[dict[str, Any]]) -> None:
    """The session is one trajectory whose sampled part is, token for token, what the engine sampled, graded 1.0."""
    proxy.wait_drained()
    got = httpx.get(f"{proxy.v1}/sessions/{session}/trajectories", timeout=30).json()["data"]
    assert len(got) == 1, [t["completion_ids"] for t in got]
    traj = got[0]
    by_id = {r["id"]: r["onthejob"] for r in records}
    assert set(traj["completion_ids"]) == {r["id"] for r in records if r["onthejob"]["session_id"] == session}
    sampled = [t for cid in traj["completion_ids"] for t in by_id[cid]["completion_token_ids"][0]]
    ids, mask = traj["token_ids"], traj["mask"]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == sampled
    assert "rerender_mismatch" not in traj["flags"], traj["flags"]
    assert traj["reward"] == 1.0


def test_claude_code_print_mode_through_the_proxy(
    cli_bin: Path,
    proxy: Proxy,
    tap: EngineTap,
    trap: OutboundTrap,
    tiny_long_engine: Engine,
    workdir: Path,
    tmp_path: Path,
) -> None:
    env = claude_env(tmp_path / "home", proxy.url, tiny_long_engine.model.name, trap.url)
    claude = str(cli_bin / "claude")
    run_cli([claude, "-p", "Read notes.txt and tell me what to do next."], env, workdir)
    run_cli([claude, "-p", "--continue", "Thanks. Anything else?"], env, workdir)
    records = recorded_exactly(proxy, tap, "anthropic")
    first = records[0]["onthejob"]["client_request"]
    assert len(first["tools"]) >= 10, first["tools"]
    assert len(records[0]["onthejob"]["prompt_token_ids"]) > 8192, "the default request must not fit the old 8k"
    tagged_by_harness(records, "claude-code", "tools")
    session = main_loop_session(records, "tools")
    feedback_attaches(proxy, session)
    one_token_exact_trajectory(proxy, session, records)
    assert trap.attempts == [], f"Claude Code tried to reach off the machine: {trap.attempts}"


def test_codex_exec_through_the_proxy(
    cli_bin: Path,
    proxy: Proxy,
    tap: EngineTap,
    trap: OutboundTrap,
    tiny_long_engine: Engine,
    workdir: Path,
    tmp_path: Path,
) -> None:
    env = codex_env(tmp_path / "home", proxy.v1, tiny_long_engine.model.name, trap.url)
    codex = str(cli_bin / "codex")
    run_cli([codex, "exec", "--skip-git-repo-check", "Read notes.txt and tell me what to do next."], env, workdir)
    run_cli([codex, "exec", "--skip-git-repo-check", "resume", "--last", "Thanks. Anything else?"], env, workdir)
    records = recorded_exactly(proxy, tap, "responses")
    first = records[0]["onthejob"]["client_request"]
    assert {t["type"] for t in first["tools"]} >= {"function", "namespace"}, json.dumps(first["tools"])[:500]
    tagged_by_harness(records, "codex", "tools")
    session = main_loop_session(records, "tools")
    feedback_attaches(proxy, session)
    one_token_exact_trajectory(proxy, session, records)
    assert trap.attempts == [], f"Codex tried to reach off the machine: {trap.attempts}"
