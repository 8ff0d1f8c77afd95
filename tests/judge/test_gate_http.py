"""The gate against a scripted OpenAI-compatible judge over real HTTP: aligned accepted, inverted refused."""

from __future__ import annotations

import math

import pytest

from judge.calibrate import gate
from judge.client import JudgeClient
from judge.errors import JudgeCallError
from judge.score import Item, calibrate, judge_items
from storage.judge_config import JUDGE_UNCALIBRATED, JudgeSettings
from tests.judge.scripted import RIGHT, scripted_judge

pytestmark = pytest.mark.anyio

RUBRIC = "The answer must be the correct number on a line 'ANSWER: N'."


def _labelled(n: int = 10) -> list[Item]:
    items = []
    for i in range(n):
        good = i % 2 == 0
        conversation = [
            {"role": "user", "content": "A box holds 3 rows of 4 eggs. How many eggs?"},
            {"role": "assistant", "content": RIGHT if good else "ANSWER: 7"},
        ]
        items.append(Item(f"s{i}", conversation, task_id="eggs", label=100.0 if good else 0.0))
    return items


def _cfg(**kw: object) -> JudgeSettings:
    return JudgeSettings.model_validate({"rubric": RUBRIC, "scale": [0, 100], **kw})


@pytest.mark.parametrize("mode", ["absolute", "relative"])
async def test_an_aligned_judge_is_accepted_and_an_inverted_one_refused(mode: str) -> None:
    cfg = _cfg(mode=mode)
    for inverted, accepted in ((False, True), (True, False)):
        async with scripted_judge(inverted=inverted) as judge, JudgeClient(judge.url, "smol", api_key="k") as client:
            result = await calibrate(client, cfg, _labelled())
        verdict = gate(result, cfg.min_agreement, cfg.min_labelled)
        assert result.n == 10 and result.unreadable == 0
        assert result.spearman == pytest.approx(-1.0 if inverted else 1.0)
        assert result.accuracy == (0.0 if inverted else 1.0)
        assert verdict.accepted is accepted
        assert verdict.reason == (JUDGE_UNCALIBRATED if inverted else None)
        headers, body = judge.requests[0]
        assert headers["X-Onthejob-Tags"] == "judge"  # the proxy records the judge's own calls as never trained on
        assert headers["Authorization"] == "Bearer k"
        assert body["model"] == "smol" and body["temperature"] == 0.0
        assert RUBRIC in body["messages"][0]["content"]
        assert len(judge.requests) == (10 if mode == "absolute" else 1)  # relative: one call for the task's group


async def test_a_judge_that_gives_no_score_is_refused_not_defaulted() -> None:
    cfg = _cfg()
    async with scripted_judge(mumble=True) as judge, JudgeClient(judge.url, "smol") as client:
        result = await calibrate(client, cfg, _labelled())
    assert (result.n, result.unreadable) == (0, 10)
    assert gate(result, cfg.min_agreement, cfg.min_labelled).reason == JUDGE_UNCALIBRATED


async def test_grades_carry_the_reasoning_and_the_comment_is_shown() -> None:
    cfg = _cfg()
    item = Item("s1", _labelled(1)[0].conversation, comment="Right, and nicely short.")
    async with scripted_judge() as judge, JudgeClient(judge.url, "smol") as client:
        (judged,) = await judge_items(client, cfg, [item])
    assert judged.score == pytest.approx(90.0)
    assert judged.reasoning == "The last answer matches the task."
    assert "Right, and nicely short." in judge.requests[0][1]["messages"][1]["content"]


async def test_an_unreachable_endpoint_is_an_error_that_says_so() -> None:
    async with scripted_judge() as judge:
        url = judge.url
    async with JudgeClient(url, "smol", timeout_s=5) as client:
        with pytest.raises(JudgeCallError, match="failed twice"):
            await client.complete([{"role": "user", "content": "hi"}])


async def test_the_probability_readout_reads_the_first_token_and_the_gate_judges_it() -> None:
    """readout 'probability': one token, P(good word) from the top logprobs; the gate as for text scores."""
    example = {"text": "Question: 2 boxes of 3?\nAnswer: ANSWER: 6\nReview: Right.", "good": True}
    cfg = _cfg(readout="probability", examples=[example])
    for inverted, accepted in ((False, True), (True, False)):
        async with scripted_judge(inverted=inverted) as judge, JudgeClient(judge.url, "smol") as client:
            result = await calibrate(client, cfg, _labelled())
        assert (result.n, result.unreadable) == (10, 0)
        assert result.spearman == pytest.approx(-1.0 if inverted else 1.0)
        assert gate(result, cfg.min_agreement, cfg.min_labelled).accepted is accepted
        _, body = judge.requests[0]
        assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == 20
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system", "user", "assistant", "user"]  # the worked example is a turn of its own
        assert body["messages"][2]["content"] == "positive"
        assert RUBRIC in body["messages"][0]["content"] and "positive or negative" in body["messages"][0]["content"]
        assert body["messages"][-1]["content"].startswith("Question: A box holds 3 rows")
    # P(positive) = e^-0.2 / (e^-0.2 + e^-1.8) on the 0..100 scale, whatever the case and spacing of the token
    async with scripted_judge() as judge, JudgeClient(judge.url, "smol") as client:
        (judged,) = await judge_items(client, cfg, _labelled(1))
    assert judged.score == pytest.approx(100 / (1 + math.exp(-1.6)))
    async with scripted_judge(mumble=True) as judge, JudgeClient(judge.url, "smol") as client:
        result = await calibrate(client, cfg, _labelled())
    assert (result.n, result.unreadable) == (0, 10)  # neither word among the top tokens: unreadable, not 0.5
