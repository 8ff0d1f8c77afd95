"""The demo tells the truth about failed calls: each round says how many failed and why; the run exits
non-zero when any call of the final held-out evaluation failed. Report functions only, no processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from examples.demo import exit_status
from examples.demo_report import RoundResult, failure_lines, final_failures, write_summary
from examples.demo_stack import DemoConfig
from examples.episodes import failure_reason, summarise
from examples.harness import EpisodeResult

BLACK_HOLE = (
    "InternalServerError: Error code: 502 - {'error': {'message': 'cannot reach an engine (tried 1 "
    "replica(s)): no engine replica may serve math@v6', 'type': 'upstream_error'}}"
)


def episode(i: int, error: str | None = None) -> EpisodeResult:
    return EpisodeResult(
        session_id=f"s{i}",
        problem_id=f"p{i}",
        question="?",
        eval=True,
        outcome="error" if error else "answered",
        answer=None if error else "1",
        correct=not error,
        reward=0.0 if error else 1.0,
        brevity=1.0,
        turns=1,
        prompt_tokens=10,
        completion_tokens=5,
        error=error,
    )


def test_failure_reasons_group_by_status_and_message() -> None:
    assert failure_reason(BLACK_HOLE) == (
        "HTTP 502: cannot reach an engine (tried 1 replica(s)): no engine replica may serve math@v6"
    )
    assert failure_reason("APIConnectionError: Connection error.") == "APIConnectionError: Connection error."
    s = summarise([episode(0), episode(1, BLACK_HOLE), episode(2, BLACK_HOLE), episode(3, "APITimeoutError: x")])
    assert (s.n, s.errors) == (1, 3)
    assert s.failures == {failure_reason(BLACK_HOLE): 2, "APITimeoutError: x": 1}


def test_a_round_with_failed_calls_says_how_many_and_why() -> None:
    heldout = summarise([episode(i, BLACK_HOLE if i < 3 else None) for i in range(8)])
    train = summarise([episode(i) for i in range(4)])
    lines = failure_lines(RoundResult(7, 6, heldout, train))
    assert lines == [
        f"  round 7 held-out: 3 of 8 episodes failed (3× {failure_reason(BLACK_HOLE)}); the reward "
        "above counts only the others"
    ]
    assert failure_lines(RoundResult(1, None, train, train)) == []
    assert (
        "training traffic: 1 of 4"
        in failure_lines(
            RoundResult(
                2,
                1,
                None,
                summarise([episode(0, "APIConnectionError: Connection error."), *(episode(i) for i in range(1, 4))]),
            )
        )[0]
    )


def test_the_demo_exits_non_zero_when_a_final_held_out_call_failed(tmp_path: Path) -> None:
    ok = summarise([episode(i) for i in range(4)])
    bad = summarise([episode(0, BLACK_HOLE), *(episode(i) for i in range(1, 4))])
    stack = cast(Any, SimpleNamespace(model_name="m", project="p", db_url="postgresql://h/db"))
    cfg = DemoConfig(out=tmp_path)
    good_run = write_summary(
        cfg, stack, [RoundResult(1, None, ok, ok), RoundResult(2, 1, ok, None)], {}, tmp_path / "a.json", 1.0
    )
    assert final_failures(good_run) == 0 and exit_status(good_run) == 0
    # A failure in an earlier round is reported, but the final evaluation measured the final adapter.
    earlier = write_summary(
        cfg, stack, [RoundResult(1, None, bad, ok), RoundResult(2, 1, ok, None)], {}, tmp_path / "b.json", 1.0
    )
    assert exit_status(earlier) == 0 and earlier["failed_episodes"] == 1
    assert earlier["rounds"][0]["heldout_failed"] == 1
    final = write_summary(
        cfg, stack, [RoundResult(1, None, ok, ok), RoundResult(2, 1, bad, None)], {}, tmp_path / "c.json", 1.0
    )
    assert final_failures(final) == 1 and exit_status(final) == 1
    assert final["final_heldout_failures"] == {failure_reason(BLACK_HOLE): 1}
