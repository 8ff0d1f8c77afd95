"""Capture real requests from Claude Code and Codex into the corpus (a tool a maintainer reruns, not a test).

    .venv/bin/python -m tests.proxy.corpus.capture [--out tests/proxy/corpus] [--raw /tmp/raw]

Each CLI (pinned in tests/harness/clis.py, from the npm cache) runs in its default mode against
a scripted stub of the API it speaks, never a model: the stub answers a main-loop call (one
that carries the CLI's tools) with a tool call, the next with another (for Codex a
*namespaced* one, returned as proxy/dialects/responses.py returns them: ``namespace`` beside
the inner ``name``), then with text; side calls get text. Every request body the CLI sends is
kept, scrubbed (:mod:`tests.proxy.corpus.scrub`): the CLIs' own prompts and tool descriptions
become placeholder text of the same length and line shape, this machine's paths and ids
become fixed ones. They are written as ``cli_<cli>_<session>_<n>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.harness.clis import claude_env, codex_env, ensure_installed
from tests.harness.tap import OutboundTrap
from tests.proxy.corpus.scrub import scrub

HERE = Path(__file__).parent


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _turn(messages: list[dict[str, Any]], result_type: str, role_key: str = "role") -> int:
    """How many tool-result turns follow the last plain user turn: where the script is."""
    n = 0
    for m in reversed(messages):
        content = m.get("content")
        if m.get("type") == result_type or (
            isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == result_type for b in content)
        ):
            n += 1
        elif m.get(role_key) == "user" and m.get("type", "message") == "message":
            return n
    return n


class Stub:
    """The scripted API: records bodies, answers each in its wire format."""

    def __init__(self, script: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
        self.script = script  # dialect -> [(tool name or namespace/name, input)] before the text answer
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    async def other(self, request: web.Request) -> web.Response:
        return web.json_response({"error": {"type": "not_found_error", "message": request.path}}, status=404)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(("anthropic", body))
        step = _turn(body.get("messages", []), "tool_result")
        names = {t.get("name") for t in body.get("tools") or []}
        plan = self.script["anthropic"]
        call = plan[step] if body.get("tools") and step < len(plan) and plan[step][0] in names else None
        mid = f"msg_{uuid.uuid4().hex[:20]}"
        if call:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:20]}",
                "name": call[0],
                "input": call[1],
            }
        else:
            block = {"type": "text", "text": "Done: the notes say to write the release notes."}
        stop = "tool_use" if call else "end_turn"
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        if not body.get("stream"):
            return web.json_response(message)
        reply = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await reply.prepare(request)
        await reply.write(
            _sse(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        **message,
                        "content": [],
                        "stop_reason": None,
                        "usage": {"input_tokens": 10, "output_tokens": 1},
                    },
                },
            )
        )
        start = {**block, "input": {}} if call else {"type": "text", "text": ""}
        await reply.write(
            _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
        )
        delta = (
            {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            if call
            else {"type": "text_delta", "text": block["text"]}
        )
        await reply.write(_sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
        await reply.write(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        await reply.write(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                },
            )
        )
        await reply.write(_sse("message_stop", {"type": "message_stop"}))
        await reply.write_eof()
        return reply

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(("responses", body))
        items = body.get("input") if isinstance(body.get("input"), list) else []
        step = _turn(items, "function_call_output")
        flat = {t.get("name") for t in body.get("tools") or [] if t.get("type") == "function"}
        flat |= {
            f"{t['name']}/{f.get('name')}"
            for t in body.get("tools") or []
            if t.get("type") == "namespace"
            for f in t.get("tools", [])
        }
        plan = self.script["responses"]
        call = plan[step] if body.get("tools") and step < len(plan) else None
        if call is not None and call[0] == "":  # Codex's first namespaced function, whatever it is
            call = _first_namespaced(body.get("tools") or [])
        call = call if call is not None and call[0] in flat else None
        rid = f"resp_{uuid.uuid4().hex[:20]}"
        if call:
            namespace, _, name = call[0].rpartition("/")
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex[:20]}",
                "status": "completed",
                "call_id": f"call_{uuid.uuid4().hex[:20]}",
                "name": name,
                "arguments": json.dumps(call[1]),
            }
            if namespace:
                item["namespace"] = namespace
        else:
            item = {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:20]}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Done: write the release notes.", "annotations": []}],
            }
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }
        response = {
            "id": rid,
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": body.get("model"),
            "output": [item],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(response)
        reply = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await reply.prepare(request)
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": {**response, "status": "in_progress", "output": []}}),
            ("response.output_item.added", {"output_index": 0, "item": {**item, "status": "in_progress"}}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": response}),
        ]
        for seq, (kind, data) in enumerate(events):
            await reply.write(_sse(kind, {"type": kind, "sequence_number": seq, **data}))
        await reply.write_eof()
        return reply


SESSIONS: dict[str, list[tuple[str, list[str]]]] = {  # cli -> [(session name, prompts: the first, then continued)]
    "claude": [
        ("read", ["Read notes.txt and tell me what to do next.", "Thanks. Anything else?"]),
        ("fix", ["Find the TODO in the code and explain it."]),
        ("plan", ["Plan the release in three steps.", "Shorter, please.", "Now as one line."]),
    ],
    "codex": [
        ("read", ["Read notes.txt and tell me what to do next.", "Thanks. Anything else?"]),
        ("fix", ["Find the TODO in the code and explain it."]),
        ("plan", ["Plan the release in three steps.", "Shorter, please.", "Now as one line."]),
    ],
}


def script(work: Path) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    return {
        "anthropic": [
            ("Bash", {"command": "ls", "description": "List files"}),
            ("Read", {"file_path": str(work / "notes.txt")}),
        ],
        "responses": [("exec_command", {"cmd": "ls"}), ("", {})],  # the second: Codex's first namespaced function
    }


def _first_namespaced(tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """A call of the first function of the first namespace tool offered, its required fields filled."""
    for tool in tools:
        if tool.get("type") == "namespace" and tool.get("tools"):
            fn = tool["tools"][0]
            required = (fn.get("parameters") or {}).get("required") or []
            return f"{tool['name']}/{fn['name']}", dict.fromkeys(required, "notes.txt")
    return None


async def capture(out: Path, raw: Path | None) -> None:
    bin_dir = ensure_installed()
    tmp = Path(tempfile.mkdtemp(prefix="corpus-"))
    work = tmp / "work"
    work.mkdir()
    (work / "notes.txt").write_text("The build is green. Next: write the release notes.\n")
    (work / "app.py").write_text("def main():\n    # TODO: handle an empty list\n    return sorted([])\n")
    stub = Stub(script(work))
    runner = web.AppRunner(stub.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url, trap = f"http://127.0.0.1:{port}", OutboundTrap()
    try:
        for cli, sessions in SESSIONS.items():
            for name, prompts in sessions:
                home = tmp / f"home-{cli}-{name}"
                env = (
                    claude_env(home, url, "m", trap.url)
                    if cli == "claude"
                    else codex_env(home, f"{url}/v1", "m", trap.url)
                )
                before = len(stub.bodies)
                for i, prompt in enumerate(prompts):
                    if cli == "claude":
                        cmd = [str(bin_dir / "claude"), "-p", *(["--continue"] if i else []), prompt]
                    else:
                        resume = ["resume", "--last"] if i else []
                        cmd = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", *resume, prompt]
                    done = await asyncio.to_thread(
                        subprocess.run,
                        cmd,
                        env=env,
                        cwd=work,
                        stdin=subprocess.DEVNULL,
                        capture_output=True,
                        text=True,
                        timeout=120,
                        check=False,
                    )
                    print(cli, name, i, "exit", done.returncode, done.stdout[-200:].strip(), done.stderr[-300:].strip())
                for n, (dialect, body) in enumerate(stub.bodies[before:]):
                    stem = f"cli_{cli}_{name}_{n:02d}"
                    if raw is not None:
                        raw.mkdir(parents=True, exist_ok=True)
                        (raw / f"{stem}.json").write_text(json.dumps(body, indent=1))
                    clean = scrub(body, {str(work): "/home/user/project", str(tmp): "/home/user"})
                    (out / dialect / f"{stem}.json").write_text(json.dumps(clean, indent=1) + "\n")
        print("outbound attempts:", trap.attempts)
    finally:
        trap.close()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--raw", type=Path, default=None, help="also keep the unscrubbed bodies here (never commit)")
    args = parser.parse_args()
    asyncio.run(capture(args.out, args.raw))


if __name__ == "__main__":
    main()
