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


@pytest.mark.parametrize(("dialect", "path"), CASES, ids=[f"{d}/{p.stem}" for d, p in CASES])
def test_same_status_prompt_ids_and_text_as_the_engine(
    dialect: str, path: Path, served: Proxy, tiny_engine: Engine
) -> None:
    body = load(path, tiny_engine.model.name)
    route = ROUTES[dialect]
    engine = httpx.post(f"{tiny_engine.url}{route}", json=body, timeout=120)
    ours = httpx.post(f"{served.url}{route}", json=body, timeout=120)
    assert ours.status_code // 100 == engine.status_code // 100, (engine.text, ours.text)
    if engine.status_code != 200:
        error_shape(dialect, ours.json())
        return
    assert answer(dialect, ours.json()) == answer(dialect, engine.json())
    rendered = httpx.post(f"{tiny_engine.url}{route}/render", json=body, timeout=60)
    assert rendered.status_code == 200, rendered.text
    served.wait_drained()
    record = httpx.get(f"{served.v1}/chat/completions/{ours.json()['id']}", timeout=10)
    assert record.status_code == 200, record.text
    assert record.json()["onthejob"]["prompt_token_ids"] == rendered.json()["token_ids"]
