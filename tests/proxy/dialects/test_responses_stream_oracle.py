"""Our Responses stream against the engine's own, event by event, as the openai SDK types them.

Each streamed request of the Responses corpus (tests/proxy/corpus/responses, ``"stream": true``:
Codex's own requests and the SDK's shapes) goes, greedy and short as test_engine_oracle.py sends
it, streamed to vLLM's ``/v1/responses`` and through the proxy. Every event of both is parsed with
the openai SDK's own type for its ``type`` (a member of ``openai.types.responses.ResponseStreamEvent``);
ours carry no field those types do not define. Sequence numbers must count 0, 1, 2, ... on both
sides and are then dropped; ids (the response's, each item's, each call's) become their prefix and
the order they first appear in; timestamps become whether they are set; a run of one item's text
deltas becomes one delta (:func:`delta_runs`). The two sequences are then compared as the SDK reads
them: the fields its types define (what vLLM adds beyond them is not compared).

Where ours differ from the engine's on purpose, a named allowance in :data:`ALLOWANCES` rewrites the
engine's events into ours, one difference each, and says why; the README's Responses table lists
them. Anything else that differs fails the case.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Union

import httpx
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from engine.launcher import Engine
from tests.proxy.conftest import Proxy
from tests.proxy.dialects.test_engine_oracle import CASES, LONG, load

# The SDK's union, picked by ``type`` (its own discriminator is metadata pydantic does not read).
EVENT_TYPES = typing.get_args(typing.get_args(ResponseStreamEvent)[0])
EVENT = TypeAdapter(Annotated[Union[EVENT_TYPES], Field(discriminator="type")])  # noqa: UP007
IDS = ("id", "item_id", "call_id")
TIMES = ("created_at", "completed_at")


def parse(raw: str) -> list[BaseModel]:
    """An SSE body's events, each as the SDK's type for it (its ``event:`` line names the same type)."""
    events = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"], block[:300]
        events.append(EVENT.validate_python(data))
    return events


def unknown(value: Any, where: str = "") -> list[str]:
    """The paths of fields the SDK's types do not define (``extra`` that its models let through)."""
    if isinstance(value, BaseModel):
        out = [f"{where}.{k}" for k in value.model_extra or {}]
        return out + [p for k in type(value).model_fields for p in unknown(getattr(value, k), f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unknown(v, f"{where}[{i}]")]
    return []


# Fields outside the SDK's type that an event of ours may carry, as vLLM's route's own events do.
AS_THE_ENGINE = {"response.function_call_arguments.done": {".name"}}


def untyped(event: BaseModel) -> list[str]:
    """:func:`unknown` of one event, less what :data:`AS_THE_ENGINE` lets it carry."""
    allowed = AS_THE_ENGINE.get(getattr(event, "type", ""), set())
    return [p for p in unknown(event) if p not in allowed]


def typed(value: Any) -> Any:
    """An SDK object as plain data, only the fields its type defines."""
    if isinstance(value, BaseModel):
        return {k: typed(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    return value


def normalised(events: list[BaseModel]) -> list[dict[str, Any]]:
    """The events as the SDK reads them, sequence numbers checked and dropped, ids and times normalised."""
    assert [e.sequence_number for e in events] == list(range(len(events)))  # type: ignore[attr-defined]
    names: dict[str, str] = {}

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items() if k != "sequence_number"}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in IDS and isinstance(value, str):
            return names.setdefault(value, f"<{value.partition('_')[0]} {len(names)}>")
        if key in TIMES and value is not None:
            return "<time>"
        return value

    return [walk(typed(e)) for e in events]


# ---------------------------------------------------------------- where ours differ from the engine's, on purpose
# Each rewrites the engine's normalised events (in place) into what we send instead; the README's Responses
# table lists them. ``request`` is the request both were sent.

Events = list[dict[str, Any]]
Allowance = Callable[[Events, dict[str, Any]], None]


def _responses(events: Events) -> Iterator[dict[str, Any]]:
    """The ``Response`` objects a stream carries (its created, in_progress and terminal events)."""
    return (e["response"] for e in events if "response" in e)


def _parts(events: Events) -> Iterator[dict[str, Any]]:
    """Every output_text part: a content part's, an item's, a final response's items'."""
    items = [e["item"] for e in events if "item" in e] + [i for r in _responses(events) for i in r["output"]]
    yield from (e["part"] for e in events if "part" in e)
    yield from (p for i in items if i["type"] == "message" for p in i["content"])


def _unset(field: str, engine: Any, ours: Any, only: Callable[[dict[str, Any]], bool] = lambda r: True) -> Allowance:
    """A field the request left unset: the engine's ``engine`` value is our ``ours``."""

    def allowance(events: Events, request: dict[str, Any]) -> None:
        for response in _responses(events):
            if field not in request and only(request) and response[field] == engine:
                response[field] = ours

    return allowance


def prompt_cache_key(events: Events, request: dict[str, Any]) -> None:
    """A ``prompt_cache_key`` we echo, as OpenAI does (the engine drops it)."""
    for response in _responses(events):
        if "prompt_cache_key" in request and response["prompt_cache_key"] is None:
            response["prompt_cache_key"] = request["prompt_cache_key"]


def completed_at(events: Events, request: dict[str, Any]) -> None:
    """A response that finished (completed or incomplete) has ``completed_at`` set (the engine: null)."""
    for response in _responses(events):
        if response["status"] in ("completed", "incomplete") and response["completed_at"] is None:
            response["completed_at"] = "<time>"


def incomplete_event(events: Events, request: dict[str, Any]) -> None:
    """A response cut at ``max_output_tokens`` ends with ``response.incomplete``, as OpenAI's does (the engine
    ends every stream with ``response.completed``, its status ``incomplete`` inside), and its items say
    ``incomplete`` (the engine's: ``completed``)."""
    last = events[-1]
    if last["type"] != "response.completed" or last["response"]["status"] != "incomplete":
        return
    last["type"] = "response.incomplete"
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"] + last["response"]["output"]
    for item in items:
        if item.get("status") == "completed":
            item["status"] = "incomplete"


def logprobs_list(events: Events, request: dict[str, Any]) -> None:
    """A text part's ``logprobs`` is a list, [] when none were asked for, as its ``content_part.added`` has it
    on both sides (the engine's done part and item: null)."""
    for part in _parts(events):
        if part["logprobs"] is None:
            part["logprobs"] = []


def cache_counts(events: Events, request: dict[str, Any]) -> None:
    """The usage's ``cached_tokens`` and ``cache_write_tokens`` are 0: the engine's chat stream carries no
    ``prompt_tokens_details`` (vLLM sends them with ``--enable-prompt-tokens-details`` only). Its responses route
    counts its prefix cache, which our request, sent second, would find warm."""
    for response in _responses(events):
        details = (response["usage"] or {}).get("input_tokens_details")
        if details:
            details["cached_tokens"] = details["cache_write_tokens"] = 0


ALLOWANCES: dict[str, Allowance] = {
    # What a request leaves unset we echo as OpenAI's defaults; the engine writes its own.
    "metadata {}": _unset("metadata", None, {}),
    "text format": _unset("text", None, {"format": {"type": "text"}, "verbosity": None}),
    "service_tier default": _unset("service_tier", "auto", "default"),
    "tool_choice auto": _unset("tool_choice", "none", "auto", only=lambda request: not request.get("tools")),
    "prompt_cache_key echoed": prompt_cache_key,
    "completed_at": completed_at,
    "response.incomplete": incomplete_event,
    "logprobs []": logprobs_list,
    "cache counts": cache_counts,
}
USED = dict.fromkeys(ALLOWANCES, 0)


# Deltas whose text is what they add up to (not a custom call's input deltas: an empty one takes back what was sent).
JOINED = ("response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta")


def delta_runs(events: Events) -> Events:
    """Each run of one item's text deltas as one delta (both sides): where the engine cuts its text into
    deltas depends on timing (vLLM merges the outputs a slow reader has not yet taken), on either route."""
    out: Events = []
    for event in events:
        last = out[-1] if out else {}
        if event["type"] in JOINED and last.get("type") == event["type"] and last["item_id"] == event["item_id"]:
            out[-1] = {**last, "delta": last["delta"] + event["delta"]}
            if "logprobs" in event:
                out[-1]["logprobs"] = last["logprobs"] + event["logprobs"]
        else:
            out.append(event)
    return out


def as_ours(theirs: Events, request: dict[str, Any]) -> Events:
    """The engine's events with every allowance applied; each that changed something is counted."""
    for name, allowance in ALLOWANCES.items():
        before = json.dumps(theirs)
        allowance(theirs, request)
        USED[name] += json.dumps(theirs) != before
    return theirs


# ---------------------------------------------------------------- the corpus, streamed at both

STREAMED = [p for d, p in CASES if d == "responses" and json.loads(p.read_text()).get("stream")]


def stream(url: str, body: dict[str, Any]) -> list[BaseModel]:
    reply = httpx.post(f"{url}/v1/responses", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/event-stream"), reply.headers
    return parse(reply.text)


def compare(path: Path, proxy: Proxy, engine: Engine) -> None:
    body = {**load("responses", path, engine.model.name), "stream": True}
    theirs, ours = stream(engine.url, body), stream(proxy.url, body)
    assert not [p for e in ours for p in untyped(e)]  # ours: only what the SDK's types define
    expected = delta_runs(as_ours(normalised(theirs), body))
    assert delta_runs(normalised(ours)) == expected


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[None]:
    """How many cases each allowance was needed for, printed (``-s``)."""
    yield
    print("\nallowances needed (cases): " + ", ".join(f"{k} {v}" for k, v in USED.items()))


@pytest.mark.engine
@pytest.mark.parametrize("path", [p for p in STREAMED if p not in LONG], ids=lambda p: p.stem)
def test_the_same_events_as_the_engines_stream(path: Path, oracle_proxy: Proxy, tiny_engine: Engine) -> None:
    compare(path, oracle_proxy, tiny_engine)


@pytest.mark.engine
@pytest.mark.parametrize("path", [p for p in STREAMED if p in LONG], ids=lambda p: p.stem)
def test_codexs_own_requests_the_same_events_on_the_long_context_engine(
    path: Path, oracle_proxy_long: Proxy, tiny_long_engine: Engine
) -> None:
    compare(path, oracle_proxy_long, tiny_long_engine)


def test_the_corpus_streams_codexs_requests_and_the_sdks() -> None:
    names = [p.stem for p in STREAMED]
    assert len(names) >= 20 and sum(n.startswith("cli_codex_") for n in names) >= 12, names
