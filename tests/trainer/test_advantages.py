"""RLOO inside groups, a running per-task baseline elsewhere, scale-only batch normalisation."""

from __future__ import annotations

import math

import pytest

from trainer.advantages import TaskBaseline, compute_advantages, normalise, raw_advantages, rloo


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    assert rloo([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert rloo([3.0, 1.0]) == pytest.approx([2.0, -2.0])
    with pytest.raises(ValueError, match="two"):
        rloo([1.0])


def test_baseline_is_a_mean_then_an_ema() -> None:
    b = TaskBaseline(window=2)
    assert b.get("t") is None
    b.update("t", 1.0)
    assert b.get("t") == 1.0
    b.update("t", 0.0)
    assert b.get("t") == 0.5  # plain mean of two
    b.update("t", 1.0)
    assert b.get("t") == 0.75  # then b += (r − b) / window
    assert b.get("unseen") == 0.75  # an unseen task falls back to the all-task mean (same rewards here)


def test_baseline_round_trips_through_json_shapes() -> None:
    b = TaskBaseline()
    b.update("a", 0.3)
    b.update(None, 1.0)
    again = TaskBaseline.from_dict(b.to_dict())
    assert again == b
    assert TaskBaseline.from_dict(None) == TaskBaseline()


def test_groups_use_rloo_and_singletons_the_task_baseline() -> None:
    b = TaskBaseline()
    b.update("solo", 0.25)
    rewards = [1.0, 0.0, 0.5, 0.9]
    groups = ["g", "g", "solo", "lonely"]
    tasks = ["g", "g", "solo", "new"]
    raw = raw_advantages(rewards, groups, tasks, b)
    # g: RLOO; solo: 0.5 − b(solo) = 0.25; new task: the all-task mean (0.25, read before this batch).
    assert raw == pytest.approx([1.0, -1.0, 0.25, 0.65])
    assert b.get("solo") == pytest.approx((0.25 + 0.5) / 2)  # updated after use


def test_first_batch_falls_back_to_the_batch_mean() -> None:
    raw = raw_advantages([1.0, 0.0, 0.5], [None, None, None], ["a", "b", "c"], TaskBaseline())
    assert raw == pytest.approx([0.5, -0.5, 0.0])


def test_a_group_with_one_graded_member_uses_the_baseline() -> None:
    b = TaskBaseline()
    b.update("t", 0.5)
    assert raw_advantages([1.0], ["t"], ["t"], b) == pytest.approx([0.5])


def test_normalise_scales_by_the_std_without_recentring() -> None:
    out = normalise([1.0, 3.0])  # std 1
    assert out == pytest.approx([1.0, 3.0])
    out = normalise([2.0, -2.0, 0.0])
    std = math.sqrt(8 / 3)
    assert out == pytest.approx([2 / std, -2 / std, 0.0])
    assert normalise([0.7]) == [0.7]  # a constant batch is left as is
    assert normalise([]) == []


def test_compute_advantages_keeps_signs() -> None:
    b = TaskBaseline()
    out = compute_advantages([1.0, 0.0, 0.2, 0.2], ["g", "g", None, None], ["g", "g", "x", "y"], b)
    assert out[0] > 0 > out[1]
    assert len(out) == 4


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        raw_advantages([1.0], [None, None], [None], TaskBaseline())
