"""The demo harness against a scripted OpenAI endpoint (httpx.MockTransport) and a recording
feedback endpoint; one test runs it against a real vLLM engine (tiny model)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from examples.episodes import run_episodes, summarise
from examples.harness import FeedbackMix, Harness, HarnessConfig
from examples.task import NUDGE, Problem, make_problems

Script = Callable[[list[dict[str, str]]], str]


class FakeModel:
    """An OpenAI chat endpoint whose replies come from a script over the conversation so far."""

    def __init__(self, script: Script, model: str = "served@v3") -> None:
        self.script, self.model = script, model
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._n = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self._lock:
            self.requests.append((dict(request.headers), body))
            self._n += 1
            cid = f"cmpl-{self._n}"
        text = self.script(body["messages"])
        return httpx.Response(
            200,
            headers={"x-request-id": cid},
            json={
                "id": "upstream-id",
                "object": "chat.completion",
                "created": 0,
                "model": self.model,
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 8, "total_tokens": 108},
            },
        )


class FeedbackSink:
    """Records feedback posts; answers 202 like a proxy that accepts a pending target."""

    def __init__(self, fail_first: int = 0) -> None:
        self.items: list[dict[str, Any]] = []
        self.auth: set[str] = set()
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            if self.fail_first > 0:
                self.fail_first -= 1
                return httpx.Response(503, json={"error": {"message": "busy"}})
            self.items.append(json.loads(request.content))
            self.auth.add(request.headers["authorization"])
        return httpx.Response(202, json={"status": "pending"})


def solver(messages: list[dict[str, str]]) -> str:
    """A model that uses the calculator properly (from the problem text's numbers, multiplying)."""
    last = messages[-1]["content"]
    if last.startswith("RESULT: "):
        return f"ANSWER: {last.removeprefix('RESULT: ')}"
    nums = [w.strip(".,?") for w in last.split() if w.strip(".,?").isdigit()]
    return f"CALC: {nums[0]}*{nums[1]}"


def harness(model: FakeModel, sink: FeedbackSink | None = None, **kw: Any) -> Harness:
    tool = kw.pop("tool", None)
    mix = kw.pop("mix", None)
    cfg = HarnessConfig(
        base_url="http://proxy.test/v1",
        api_key="sk-harness",
        model="support-agent",
        feedback_url="http://proxy.test/v1/feedback" if sink else None,
        **kw,
    )
    extra = {"tool": tool} if tool else {}
    return Harness(
        cfg,
        mix,
        openai_http=httpx.Client(transport=httpx.MockTransport(model)),
        http=httpx.Client(transport=httpx.MockTransport(sink or FeedbackSink())),
        **extra,
    )


def multiplication(n: int = 1) -> list[Problem]:
    return [p for p in make_problems("train", 80) if p.template in ("boxes", "seats")][:n]


def test_episode_runs_the_tool_loop_and_grades_it() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    problem = multiplication()[0]
    with harness(model, sink, mix=FeedbackMix(reward=1.0, thumbs=0, comment=0)) as h:
        r = h.episode(problem, session_id="s-1")
    assert (r.outcome, r.correct, r.turns) == ("answered", True, 2)
    assert r.reward == 1.0  # 16 completion tokens, within the budget
    assert r.completion_ids == ["cmpl-1", "cmpl-2"]
    assert r.served_models == ["served@v3", "served@v3"]
    assert r.transcript[-3]["content"].startswith("CALC: ")
    assert r.transcript[-2] == {"role": "user", "content": f"RESULT: {problem.answer}"}
    # the second request extends the first conversation verbatim
    first, second = (body["messages"] for _, body in model.requests)
    assert second[: len(first)] == first
    assert sink.items == [
        {"target": {"session_id": "s-1"}, "name": "reward", "value": 1.0, "source": "demo-harness", "id": "s-1:reward"}
    ]
    assert sink.auth == {"Bearer sk-harness"}


def test_headers_name_session_task_and_eval_tag() -> None:
    model = FakeModel(solver)
    problem = multiplication()[0]
    with harness(model) as h:
        h.episode(problem, session_id="train-1")
        h.episode(problem, session_id="eval-1", eval=True)
    (h1, b1), _, (h2, b2), _ = model.requests
    assert (h1["x-session-id"], h1["x-task-id"]) == ("train-1", problem.id)
    assert "x-onthejob-tags" not in h1
    assert (h2["x-session-id"], h2["x-onthejob-tags"]) == ("eval-1", "eval")
    assert b1["temperature"] == 0.7 and b2["temperature"] == 0.0
    assert b1["model"] == "support-agent" and b1["stop"] == ["\n", "RESULT:"]
    assert h1["authorization"] == "Bearer sk-harness"


def test_step_limit_ends_the_episode_as_a_timeout_outcome() -> None:
    model, sink = FakeModel(lambda _: "Let me think about it."), FeedbackSink()
    with harness(model, sink, max_turns=3) as h:
        r = h.episode(multiplication()[0], session_id="s-t")
    assert (r.outcome, r.turns, r.reward) == ("timeout", 3, 0.0)
    assert [m["content"] for m in r.transcript if m["role"] == "user"][-2:] == [NUDGE, NUDGE]
    assert [(i["name"], i["value"]) for i in sink.items] == [("outcome", "timeout")]
    assert sink.items[0]["target"] == {"session_id": "s-t"}


def test_tool_timeout_ends_the_episode_as_a_timeout_outcome() -> None:
    release = threading.Event()

    def slow_tool(expression: str) -> str:
        release.wait(5)
        return "0"

    model, sink = FakeModel(solver), FeedbackSink()
    try:
        with harness(model, sink, tool=slow_tool, tool_timeout_s=0.05) as h:
            r = h.episode(multiplication()[0])
    finally:
        release.set()
    assert (r.outcome, r.turns) == ("timeout", 1)
    assert [i["name"] for i in sink.items] == ["outcome"]


def test_calculator_errors_are_shown_to_the_model() -> None:
    model = FakeModel(
        lambda m: "CALC: apples+pears" if m[-1]["role"] == "user" and "RESULT" not in m[-1]["content"] else "ANSWER: 3"
    )
    with harness(model) as h:
        r = h.episode(multiplication()[0])
    assert r.transcript[-2]["content"].startswith("RESULT: error: ")
    assert r.outcome == "answered" and not r.correct


def test_verbose_answers_lose_reward_for_length() -> None:
    def verbose(messages: list[dict[str, str]]) -> str:
        return solver(messages) + " = something\nANSWER: 12"  # hallucinated result after the action

    model = FakeModel(verbose)
    with harness(model) as h:
        r = h.episode(multiplication()[0])
    assert r.correct and r.outcome == "answered"  # the first action in each message is what counts
    assert r.reward == 1.0  # the fake endpoint reports 8 tokens a call; brevity comes from usage
    assert r.completion_tokens == 16 and r.reply_tokens == [8, 8]  # each reply's, for mine's long answers


def test_feedback_mix_has_every_kind_and_silence() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    problems = multiplication(4)
    with harness(model, sink) as h:
        results = run_episodes(h, problems, attempts=25, workers=4, progress=False)
    assert len(results) == 100 and all(r.outcome == "answered" for r in results)
    names = [i["name"] for i in sink.items]
    assert {"reward", "thumbs", "review"} <= set(names)
    assert len(sink.items) < len(results)  # some sessions are never graded
    assert sum(not r.feedback for r in results) == len(results) - len(sink.items)
    for item in sink.items:
        if item["name"] == "thumbs":
            assert item["value"] is True and item["target"]["completion_id"].startswith("cmpl-")
        if item["name"] == "review":
            assert "value" not in item and item["comment"]
        if item["name"] == "reward":
            assert 0.0 <= item["value"] <= 1.0
    assert len({i["id"] for i in sink.items}) == len(sink.items)


def test_eval_episodes_are_always_graded_with_a_reward() -> None:
    model, sink = FakeModel(solver), FeedbackSink()
    with harness(model, sink) as h:
        results = run_episodes(h, multiplication(3), eval=True, attempts=5, progress=False)
    assert [i["name"] for i in sink.items] == ["reward"] * 15
    assert all(r.eval for r in results)


def test_feedback_is_retried_on_server_errors() -> None:
    model, sink = FakeModel(solver), FeedbackSink(fail_first=2)
    with harness(model, sink, mix=FeedbackMix(reward=1.0, thumbs=0, comment=0)) as h:
        r = h.episode(multiplication()[0])
    assert r.feedback == ["reward"] and r.feedback_errors == 0
    assert len(sink.items) == 1


def test_an_unreachable_model_is_an_error_never_graded() -> None:
    def down(_: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    sink = FeedbackSink()
    cfg = HarnessConfig(base_url="http://proxy.test/v1", api_key="k", model="m", feedback_url="http://proxy.test/fb")
    h = Harness(
        cfg,
        openai_http=httpx.Client(transport=httpx.MockTransport(down)),
        http=httpx.Client(transport=httpx.MockTransport(sink)),
    )
    with h:
        r = h.episode(multiplication()[0])
    assert r.outcome == "error" and "Connection" in (r.error or "")
    assert sink.items == []
    s = summarise([r])
    assert (s.n, s.errors) == (0, 1)


def test_summarise() -> None:
    model = FakeModel(solver)
    problems = [p for p in make_problems("heldout", 40)][:10]
    with harness(model) as h:
        results = run_episodes(h, problems, eval=True, progress=False)
    s = summarise(results)
    right = sum(r.correct for r in results)
    assert s.n == 10 and s.accuracy == right / 10
    assert 0 < right < 10  # the fake always multiplies: right on some templates only
    assert s.stderr > 0
    assert [r.problem_id for r in results] == [p.id for p in problems]


@pytest.fixture()
def feedback_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP endpoint (plain http.server) that records what the harness posts."""
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(202)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/feedback", got
    server.shutdown()
    server.server_close()


@pytest.mark.engine
def test_harness_against_a_real_engine(tiny_engine: Any, feedback_server: tuple[str, list[dict[str, Any]]]) -> None:
    """Any OpenAI endpoint will do: a bare vLLM (tiny model, whose text is noise) ends every
    episode at the step limit, and the harness reports those as timeouts."""
    url, got = feedback_server
    cfg = HarnessConfig(
        base_url=f"{tiny_engine.url}/v1",
        api_key="none",
        model=tiny_engine.model.name,
        feedback_url=url,
        max_tokens=8,
        max_turns=2,
    )
    with Harness(cfg) as h:
        results = run_episodes(h, make_problems("heldout", 3), workers=3, progress=False)
    assert [r.outcome for r in results] == ["timeout"] * 3
    assert all(r.turns == 2 and 0 < r.completion_tokens <= 16 and r.prompt_tokens > 0 for r in results)
    assert all(r.completion_ids == [] for r in results)  # a bare engine sends no x-request-id
    assert sorted(i["target"]["session_id"] for i in got) == sorted(r.session_id for r in results)
    assert {i["value"] for i in got} == {"timeout"}
