"""The support family's harness: :class:`examples.harness.Harness` that also runs support problems.

:class:`SupportHarness` runs the support agent's loop (``LOOKUP:`` through the order tool,
:func:`examples.support.lookup`, behind the harness's tool timeout, then ``ANSWER:``), grades it by the
hidden rule (:func:`examples.support.grade`) and gives the customer's words
(:mod:`examples.support_customer`) as a comment or as the next turn. It runs arithmetic problems
unchanged, so one harness (one alias, one key) serves both families.

Checked through the proxy (6 training episodes, ``voice="reply"``, 2026-12-03): the stored rows give
every answer its customer's reply as implicit feedback (:func:`storage.hindsight.next_turn_feedback`),
and, unless the project's ``implicit_feedback_skip`` names ``RESULT:`` (``demo --jobs two`` does), each
``RESULT:`` line as "feedback" on the ``LOOKUP:`` call before it, since tool results in this text
protocol are user messages (arithmetic's ``CALC:`` results too).
"""

from __future__ import annotations

import re
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Literal

from examples.harness import EpisodeResult, Harness
from examples.support import NUDGE, OrderNotFound, SupportProblem, first_messages, grade, lookup, parse_action
from examples.support_customer import customer_says
from examples.task import Problem

Voice = Literal["comment", "reply"]


class SupportHarness(Harness):
    """:class:`Harness` that also runs support problems: the order tool, the hidden rule, the customer's words.

    ``voice`` is how the customer answers training episodes: a ``comment`` posted as feedback (no
    value), or a ``reply`` sent as the next user turn of the conversation (one more call, whose
    reply is not graded). ``cfg.feedback``: ``"numeric"`` grades training episodes too (the comparison
    arm), ``"none"`` says nothing, any other arm is the customer's words; held-out episodes are
    always graded numerically.
    """

    def __init__(self, *args: Any, voice: Voice = "comment", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.voice: Voice = voice

    def episode(  # widens the problem type: arithmetic problems run as before
        self, problem: Problem | SupportProblem, *, eval: bool = False, session_id: str | None = None
    ) -> EpisodeResult:
        if isinstance(problem, Problem):
            return super().episode(problem, eval=eval, session_id=session_id)
        session_id = session_id or f"sp-{uuid.uuid4().hex[:16]}"
        headers, temperature, result = self._begin(problem.id, problem.question, eval, session_id)
        messages = first_messages(problem)
        looked_up: list[str] = []
        try:
            self._support_loop(messages, headers, temperature, result, looked_up)
        except Exception as exc:  # noqa: BLE001 - an infrastructure failure: recorded, never graded
            result.outcome, result.error = "error", f"{type(exc).__name__}: {exc}"
        if result.outcome != "error":
            g = grade(problem, result.answer, result.completion_tokens)
            result.correct, result.brevity = g.correct, g.brevity
            result.reward = g.reward if result.outcome == "answered" else 0.0
            try:
                self._customer(problem, result, looked_up, messages, headers, temperature)
            except Exception as exc:  # noqa: BLE001 - the reply turn failed: the grade stands, the error is kept
                result.error = f"customer reply: {type(exc).__name__}: {exc}"
        result.transcript = messages
        return result

    def _support_loop(
        self,
        messages: list[dict[str, str]],
        headers: dict[str, str],
        temperature: float,
        result: EpisodeResult,
        looked_up: list[str],
    ) -> None:
        for _ in range(self.cfg.max_turns):
            action = parse_action(self._call(messages, headers, temperature, result))
            if action.kind == "answer":
                result.outcome, result.answer = "answered", action.argument
                return
            if action.kind == "lookup":
                if match := re.search(r"\d{5}", action.argument):
                    looked_up.append(match.group(0))
                observation = self._run_lookup(action.argument)
                if observation is None:
                    result.outcome = "timeout"
                    return
                messages.append({"role": "user", "content": f"RESULT: {observation}"})
            else:
                messages.append({"role": "user", "content": NUDGE})
        result.outcome = "timeout"

    def _run_lookup(self, argument: str) -> str | None:
        future: Future[str] = self._tools.submit(lookup, argument)
        try:
            return future.result(timeout=self.cfg.tool_timeout_s)
        except OrderNotFound as exc:
            return f"error: {exc.args[0]}"
        except FutureTimeout:
            future.cancel()
            return None

    def _customer(
        self,
        problem: SupportProblem,
        result: EpisodeResult,
        looked_up: list[str],
        messages: list[dict[str, str]],
        headers: dict[str, str],
        temperature: float,
    ) -> None:
        """Held-out: the numeric grade. Training: the customer's words, as a comment or as the next turn."""
        session = {"session_id": result.session_id}
        items: list[dict[str, Any]] = []
        if result.outcome == "timeout" and (result.eval or self.cfg.feedback != "none"):
            comment = f"no answer within {self.cfg.max_turns} turns or the tool timed out"
            items.append({"target": session, "name": "outcome", "value": "timeout", "comment": comment})
        elif result.eval or self.cfg.feedback == "numeric":  # numeric: the comparison arm, a grade per episode
            items.append({"target": session, "name": "reward", "value": result.reward})
            if result.eval and self.cfg.feedback == "comments":  # the labelled set a judge is calibrated on
                items[-1]["comment"] = customer_says(
                    problem, looked_up, result.answer, result.correct, result.brevity, seed=result.session_id
                )
        elif self.cfg.feedback != "none":
            text = customer_says(
                problem, looked_up, result.answer, result.correct, result.brevity, seed=result.session_id
            )
            if self.voice == "reply":
                messages.append({"role": "user", "content": text})
                self._call(messages, headers, temperature, result)  # the agent's answer to it is not graded
                result.feedback.append("reply")
            else:
                items.append({"target": session, "name": "review", "comment": text})
        if self.cfg.feedback_url is None:
            return
        for item in items:
            item.setdefault("source", self.cfg.source)
            item["id"] = f"{result.session_id}:{item['name']}"
            if self._post(item):
                result.feedback.append(str(item["name"]))
            else:
                result.feedback_errors += 1
