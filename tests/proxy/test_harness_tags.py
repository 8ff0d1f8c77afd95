"""Calls from Claude Code and Codex are tagged with the harness, its session and whether they are side calls.

The headers are the ones the pinned CLIs (tests/harness/clis.py) sent in their default modes,
captured by a stub (tests/proxy/corpus/capture.py), names lower-cased as the ASGI server
hands them on; tests/harness/test_cli_e2e.py checks the same tags on a real run's records.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.link_keys import harness_tags, naming

CLAUDE = {
    "user-agent": "claude-cli/2.1.197 (external, sdk-cli)",
    "x-app": "cli",
    "x-claude-code-session-id": "604d6272-3839-4b1b-8e33-e48825ba31d2",
    "anthropic-version": "2023-06-01",
}
TURN = {
    "session_id": "01a2462b-5098-72c3-a67c-68f8fbe192a0",
    "thread_id": "01a2462b-5098-72c3-a67c-68f8fbe192a0",
    "request_kind": "turn",
    "turn_trigger": "exec",
}
CODEX = {
    "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown (codex_exec; 0.171.0)",
    "originator": "codex_exec",
    "session-id": "01a2462b-5098-72c3-a67c-68f8fbe192a0",
    "thread-id": "01a2462b-5098-72c3-a67c-68f8fbe192a0",
    "x-codex-turn-metadata": json.dumps(TURN),
}
TOOLS: dict[str, Any] = {"tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}


def test_claude_codes_agent_loop_is_tagged_with_its_session_and_a_call_without_tools_as_a_side_call() -> None:
    session = "claude-code-session:604d6272-3839-4b1b-8e33-e48825ba31d2"
    assert harness_tags(CLAUDE, TOOLS) == ("harness:claude-code", session)
    assert harness_tags(CLAUDE, {"messages": []}) == ("harness:claude-code", session, "side-call")
    sub = {**CLAUDE, "x-claude-code-agent-id": "a1"}
    assert harness_tags(sub, TOOLS) == ("harness:claude-code", session, "subagent")


def test_codex_turns_are_tagged_with_the_thread_and_other_request_kinds_as_side_calls() -> None:
    thread = "codex-thread:01a2462b-5098-72c3-a67c-68f8fbe192a0"
    assert harness_tags(CODEX, TOOLS) == ("harness:codex", thread)
    compact = {**CODEX, "x-codex-turn-metadata": json.dumps({**TURN, "request_kind": "compact"})}
    assert harness_tags(compact, TOOLS) == ("harness:codex", thread, "side-call")
    broken = {**CODEX, "x-codex-turn-metadata": "{not json"}
    assert harness_tags(broken, TOOLS) == ("harness:codex", thread)


def test_other_callers_get_no_harness_tags_and_odd_ids_are_left_out() -> None:
    assert harness_tags({"user-agent": "OpenAI/Python 1.99.0"}, {}) == ()
    assert harness_tags({}, {}) == ()
    long_id = {**CLAUDE, "x-claude-code-session-id": "x" * 65}
    assert harness_tags(long_id, TOOLS) == ("harness:claude-code",)
    comma = {**CODEX, "thread-id": "a,b"}
    assert harness_tags(comma, TOOLS) == ("harness:codex",)


def test_the_harness_tags_follow_the_clients_own_and_are_not_repeated() -> None:
    headers = {**CLAUDE, "x-onthejob-tags": "eval, harness:claude-code"}
    got = naming(headers, TOOLS, None).tags
    assert got == ("eval", "harness:claude-code", "claude-code-session:604d6272-3839-4b1b-8e33-e48825ba31d2")
    assert naming({"x-onthejob-tags": "eval"}, TOOLS, None).tags == ("eval",)
