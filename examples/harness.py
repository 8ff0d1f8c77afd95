"""An agent harness written the way an enterprise writes one: it knows an OpenAI base URL, an API key
and a feedback URL, and nothing else about what serves it.

It runs its own multi-turn loop with the ``openai`` SDK, executes its own tool (the calculator in
:mod:`examples.task`, behind a timeout), grades each episode programmatically, and posts feedback
over plain REST with ``httpx`` — the same calls a curl script would make::

    curl -X POST $FEEDBACK_URL -H "authorization: Bearer $KEY" -H 'content-type: application/json' \\
         -d '{"target": {"session_id": "S"}, "name": "reward", "value": 0.8, "source": "grader"}'

Feedback is deliberately the realistic mix a production system produces: numeric grades,
thumbs on some completions, text-only comments, episodes nobody grades, and
``outcome: timeout`` when the harness's own step limit or tool timeout ends an episode.

Headers it sends (any OpenAI endpoint ignores them): ``X-Session-Id`` names the episode,
``X-Task-Id`` the problem, and held-out (evaluation) calls carry ``X-Onthejob-Tags: eval``.
It reads the completion id from the ``x-request-id`` response header when there is one.

This module is one episode, from the first message to the feedback it posts; running many episodes
and summarising them is :mod:`examples.episodes`.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx
from openai import OpenAI

from examples.feedback import CorrectedTurn, comment, correction
from examples.task import NUDGE, CalcError, Problem, calculate, first_messages, grade, parse_action, parse_number

Outcome = Literal["answered", "timeout", "error"]
# What training traffic is graded with: today's numeric mix, only comments, only corrections, or
# nothing (the judge's self-evaluation). Held-out episodes always get their numeric grade.
FeedbackArm = Literal["numeric", "comments", "corrections", "none"]


@dataclass(frozen=True)
class HarnessConfig:
    """Where the harness sends traffic and how it samples; nothing here is onthejob-specific."""

    base_url: str
    api_key: str
    model: str
    feedback_url: str | None = None  # None: grade locally, post nothing
    temperature: float = 0.7  # production traffic; held-out runs are greedy (0)
    max_tokens: int = 64
    # Every action is one line: stop at the newline, as ReAct harnesses stop at their action,
    # and never let the model write the tool's RESULT for it.
    stop: tuple[str, ...] = ("\n", "RESULT:")
    max_turns: int = 4  # the harness's own step limit: past it the episode times out
    tool_timeout_s: float = 2.0
    request_timeout_s: float = 120.0
    source: str = "demo-harness"
    feedback: FeedbackArm = "numeric"
    correct: CorrectedTurn = "last"  # the corrections arm: which call is corrected (examples.feedback.correction)
    # -1: training traffic is graded with the reward's sign flipped (a broken grader; held-out stays honest)
    reward_sign: float = 1.0


@dataclass(frozen=True)
class FeedbackMix:
    """Shares of finished (not timed-out) episodes graded each way; the rest is never graded."""

    reward: float = 0.55  # numeric grade in [0, 1] on the session
    thumbs: float = 0.20  # thumbs up/down (correct or not) on the final completion
    comment: float = 0.10  # a sentence and no value


@dataclass
class EpisodeResult:
    """What one episode did and how it was graded (the harness's own record)."""

    session_id: str
    problem_id: str
    question: str
    eval: bool
    outcome: Outcome
    answer: str | None
    correct: bool
    reward: float
    brevity: float
    turns: int
    prompt_tokens: int
    completion_tokens: int
    completion_ids: list[str] = field(default_factory=list)
    reply_tokens: list[int] = field(default_factory=list)  # completion tokens of each reply (0: usage not given)
    served_models: list[str] = field(default_factory=list)
    feedback: list[str] = field(default_factory=list)  # names posted, e.g. ["reward"], ["outcome"]
    feedback_errors: int = 0
    error: str | None = None
    transcript: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fraction_of(key: str) -> float:
    """A stable number in [0, 1) from a string, so which episodes get which feedback is reproducible."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


class Harness:
    """One client, one feedback poster; :meth:`episode` is safe to call from several threads."""

    def __init__(
        self,
        cfg: HarnessConfig,
        mix: FeedbackMix | None = None,
        *,
        tool: Callable[[str], str] = calculate,
        http: httpx.Client | None = None,
        openai_http: httpx.Client | None = None,
    ) -> None:
        self.cfg = cfg
        self.mix = mix or FeedbackMix()
        self.tool = tool
        self.client = OpenAI(
            base_url=cfg.base_url,
            api_key=cfg.api_key,
            timeout=cfg.request_timeout_s,
            max_retries=1,
            http_client=openai_http,  # type: ignore[arg-type]  # the SDK takes httpx or httpx2 clients
        )
        self.http = http or httpx.Client(timeout=30.0)
        self._tools = ThreadPoolExecutor(max_workers=2, thread_name_prefix="calculator")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._tools.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        self.client.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one episode -------------------------------------------------------------------

    def episode(self, problem: Problem, *, eval: bool = False, session_id: str | None = None) -> EpisodeResult:
        """Solve one problem: chat, run the calculator, grade, post feedback."""
        session_id = session_id or f"ep-{uuid.uuid4().hex[:16]}"
        headers, temperature, result = self._begin(problem.id, problem.question, eval, session_id)
        messages = first_messages(problem)
        try:
            self._loop(problem, messages, headers, temperature, result)
        except Exception as exc:  # noqa: BLE001 - an infrastructure failure: recorded, never graded
            result.outcome, result.error = "error", f"{type(exc).__name__}: {exc}"
        result.transcript = messages
        if result.outcome != "error":
            g = grade(problem, result.answer, result.completion_tokens)
            result.correct, result.brevity = g.correct, g.brevity
            result.reward = g.reward if result.outcome == "answered" else 0.0
            self._post_feedback(problem, result)
        return result

    def _begin(
        self, problem_id: str, question: str, eval: bool, session_id: str
    ) -> tuple[dict[str, str], float, EpisodeResult]:
        """An episode's headers, sampling temperature and (not yet graded) result."""
        headers = {"X-Session-Id": session_id, "X-Task-Id": problem_id}
        if eval:
            headers["X-Onthejob-Tags"] = "eval"
        result = EpisodeResult(
            session_id=session_id,
            problem_id=problem_id,
            question=question,
            eval=eval,
            outcome="timeout",
            answer=None,
            correct=False,
            reward=0.0,
            brevity=0.0,
            turns=0,
            prompt_tokens=0,
            completion_tokens=0,
        )
        return headers, (0.0 if eval else self.cfg.temperature), result

    def _call(
        self, messages: list[dict[str, str]], headers: dict[str, str], temperature: float, result: EpisodeResult
    ) -> str:
        """One chat turn through the proxy, counted in ``result``; the reply's text, appended to ``messages``."""
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.cfg.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=self.cfg.max_tokens,
            temperature=temperature,
            stop=list(self.cfg.stop),
            extra_headers=headers,
        )
        completion = raw.parse()
        result.turns += 1
        if request_id := raw.headers.get("x-request-id"):
            result.completion_ids.append(request_id)
        result.served_models.append(completion.model)
        tokens = completion.usage.completion_tokens if completion.usage is not None else 0
        if completion.usage is not None:
            result.prompt_tokens += completion.usage.prompt_tokens
            result.completion_tokens += tokens
        result.reply_tokens.append(tokens)
        text = completion.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})  # verbatim: the next prompt extends this one
        return text

    def _loop(
        self,
        problem: Problem,
        messages: list[dict[str, str]],
        headers: dict[str, str],
        temperature: float,
        result: EpisodeResult,
    ) -> None:
        for _ in range(self.cfg.max_turns):
            action = parse_action(self._call(messages, headers, temperature, result))
            if action.kind == "answer":
                result.outcome, result.answer = "answered", action.argument
                return
            if action.kind == "calc":
                observation = self._run_tool(action.argument)
                if observation is None:  # the tool timed out: the harness gives up on the episode
                    result.outcome = "timeout"
                    return
                messages.append({"role": "user", "content": f"RESULT: {observation}"})
            else:
                messages.append({"role": "user", "content": NUDGE})
        result.outcome = "timeout"  # step limit

    def _run_tool(self, expression: str) -> str | None:
        """The calculator, run under the harness's tool timeout; None if it timed out."""
        future: Future[str] = self._tools.submit(self.tool, expression)
        try:
            return future.result(timeout=self.cfg.tool_timeout_s)
        except CalcError as exc:
            return f"error: {exc}"
        except FutureTimeout:
            future.cancel()
            return None

    # ---- feedback ----------------------------------------------------------------------

    def _post_feedback(self, problem: Problem, result: EpisodeResult) -> None:
        """The realistic mix: grades, thumbs, comments, silence, and timeouts reported as outcomes."""
        if self.cfg.feedback_url is None:
            return
        session = {"session_id": result.session_id}
        items: list[dict[str, Any]] = []
        if not result.eval and self.cfg.feedback != "numeric":
            items = _text_feedback(self.cfg.feedback, problem, result, self.cfg.correct)
        elif result.outcome == "timeout":
            items.append(
                {
                    "target": session,
                    "name": "outcome",
                    "value": "timeout",
                    "comment": f"no answer within {self.cfg.max_turns} turns or the tool timed out",
                }
            )
        elif result.eval:
            items.append({"target": session, "name": "reward", "value": result.reward})
            if self.cfg.feedback == "comments":  # the labelled set a judge (or keyword rule) is calibrated on
                items[-1]["comment"] = _text_feedback("comments", problem, result)[0]["comment"]
        else:
            u, m = fraction_of(result.session_id), self.mix
            last = {"completion_id": result.completion_ids[-1]} if result.completion_ids else session
            if u < m.reward:
                items.append({"target": session, "name": "reward", "value": result.reward})
            elif u < m.reward + m.thumbs:
                items.append({"target": last, "name": "thumbs", "value": result.correct})
            elif u < m.reward + m.thumbs + m.comment:
                items.append({"target": session, "name": "review", "comment": _review(problem, result)})
        if not result.eval and self.cfg.reward_sign < 0:
            items = [_flipped(item) for item in items]
        for item in items:
            item.setdefault("source", self.cfg.source)
            item["id"] = f"{result.session_id}:{item['name']}"  # idempotency key: a retry never double-counts
            if self._post(item):
                result.feedback.append(str(item["name"]))
            else:
                result.feedback_errors += 1

    def _post(self, item: dict[str, Any], attempts: int = 3) -> bool:
        assert self.cfg.feedback_url is not None
        headers = {"authorization": f"Bearer {self.cfg.api_key}"}
        for attempt in range(attempts):
            try:
                resp = self.http.post(self.cfg.feedback_url, json=item, headers=headers)
            except httpx.TransportError:
                resp = None
            if resp is not None and resp.status_code < 300:
                return True
            if resp is not None and resp.status_code < 500 and resp.status_code != 429:
                return False  # our request is wrong; retrying will not fix it
            time.sleep(0.2 * 2**attempt)
        return False


def _flipped(item: dict[str, Any]) -> dict[str, Any]:
    """The same grade with its sign flipped: a reward negated, a thumb turned over."""
    value = item.get("value")
    if isinstance(value, bool):
        return {**item, "value": not value}
    if isinstance(value, int | float):
        return {**item, "value": -float(value)}
    return item


def _text_feedback(
    arm: FeedbackArm, problem: Problem, result: EpisodeResult, correct: CorrectedTurn = "last"
) -> list[dict[str, Any]]:
    """The comments arm: every episode a comment and no score; corrections: the right line; none: nothing."""
    if arm == "comments":
        answer = parse_number(result.answer) if result.answer is not None else None
        text = comment(problem, answer, result.correct, result.brevity, seed=result.session_id)
        return [{"target": {"session_id": result.session_id}, "name": "review", "comment": text}]
    if arm == "corrections" and result.completion_ids:
        target = {"completion_id": result.completion_ids[-1 if correct == "last" else 0]}
        return [{"target": target, "name": "correction", "comment": correction(problem, correct)}]
    return []


def _review(problem: Problem, result: EpisodeResult) -> str:
    """What a human reviewer might write instead of a score."""
    if result.correct and result.brevity >= 1.0:
        return "Correct and to the point."
    if result.correct:
        return "Right answer, but far too wordy: just use the calculator and answer."
    return f"Wrong: the answer to '{problem.question}' is {problem.answer}."
