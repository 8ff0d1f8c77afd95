"""Screening counts every exclusion; collation keeps ids, mask, μ and sampling aligned."""

from __future__ import annotations

import math

import torch

from tests.trainer.helpers import make_trajectory
from trainer.batch import (
    Example,
    collate,
    micro_batches,
    missing_behaviour,
    reasons,
    recorded_behaviour,
    screen,
    token_sampling,
    trained_tokens,
)
from trainer.logprobs import Sampling


def test_screen_counts_each_reason() -> None:
    good = make_trajectory("good", [1, 2], [3, 4])
    trajectories = [
        good,
        make_trajectory("ungraded", [1, 2], [3], reward=None),
        make_trajectory("eval", [1, 2], [3], tags=["eval"]),
        make_trajectory("long", list(range(10)), [3]),
        make_trajectory("empty", [1, 2], []),
        make_trajectory("penalised", [1], [2], sampling={"frequency_penalty": 0.5}),
    ]
    kept, dropped = screen(trajectories, max_len=8)
    assert [t.id for t in kept] == ["good"]
    assert dropped == {
        "ungraded": "ungraded",
        "eval": "eval",
        "long": "too_long",
        "empty": "no_sampled_tokens",
        "penalised": "unsupported_sampling",
    }
    assert reasons(dropped)["too_long"] == 1


def test_misaligned_trajectories_are_dropped() -> None:
    t = make_trajectory("x", [1, 2], [3])
    t.logprobs.append(None)
    assert screen([t], 100)[1] == {"x": "misaligned"}


def test_behaviour_is_nan_where_unknown() -> None:
    t = make_trajectory("x", [1, 2], [3, 4, 5], logprobs=[-0.5, None, float("nan")])
    assert missing_behaviour(t)
    mu = recorded_behaviour(t)
    assert mu[2] == -0.5 and all(math.isnan(v) for v in (mu[0], mu[1], mu[3], mu[4]))
    assert not missing_behaviour(make_trajectory("y", [1], [2], logprobs=[-0.1]))
    assert trained_tokens(t) == 3


def test_token_sampling_follows_turns() -> None:
    t = make_trajectory("x", [1, 2], [3, 4], sampling={"temperature": 0.7, "top_p": 0.9})
    params = token_sampling(t)
    assert params[:2] == [Sampling(), Sampling()]
    assert params[2:] == [Sampling(0.7, 0.9)] * 2


def test_collate_pads_right_and_aligns_fields() -> None:
    a = make_trajectory("a", [1, 2], [3, 4], logprobs=[-0.1, -0.2], sampling={"temperature": 0.5, "top_k": 5})
    b = make_trajectory("b", [7], [8], logprobs=[-0.3])
    batch = collate([Example(a, 1.5, recorded_behaviour(a)), Example(b, -1.0, recorded_behaviour(b))], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [7, 8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert batch.behav[0, 2:].tolist() == torch.tensor([-0.1, -0.2]).tolist()
    assert math.isnan(float(batch.behav[1, 2]))
    assert batch.temperature[0].tolist() == [1.0, 1.0, 0.5, 0.5]
    assert batch.top_k[0].tolist() == [0, 0, 5, 5]
    assert batch.adv.tolist() == [1.5, -1.0]
    assert batch.n_tokens == 3


def test_first_token_is_never_trained_on() -> None:
    t = make_trajectory("x", [], [5, 6], logprobs=[-0.1, -0.2])
    batch = collate([Example(t, 1.0, recorded_behaviour(t))], pad_id=0)
    assert batch.mask.tolist() == [[0, 1]]
    assert math.isnan(float(batch.behav[0, 0]))


def test_micro_batches_respect_the_token_budget() -> None:
    examples = [Example(make_trajectory(str(n), [1] * n, [2]), 1.0, []) for n in (3, 9, 5, 1)]
    groups = [[e.length for e in g] for g in micro_batches(examples, max_tokens=12)]
    assert groups == [[10], [6, 4], [2]]
    assert sum(len(g) for g in groups) == 4


def test_packing_shares_rows_and_restarts_positions() -> None:
    from trainer.batch import pack_rows

    assert pack_rows([6, 2, 3, 4, 1], width=6) == [[0], [3, 1], [2, 4]]
    trajectories = [make_trajectory(str(n), [1] * (n - 1), [n]) for n in (6, 2, 3)]
    batch = collate([Example(t, 1.0, recorded_behaviour(t)) for t in trajectories], pad_id=0, pack=True)
    assert batch.input_ids.shape == (3, 6)  # the objectives keep one example per row
    packed = batch.packed
    assert packed is not None
    assert packed.input_ids.tolist() == [[1, 1, 1, 1, 1, 6], [1, 1, 3, 1, 2, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]]
    assert packed.row.tolist() == [0, 1, 1] and packed.offset.tolist() == [0, 3, 0]
    # Nothing to share: the padded layout is as small, no packing.
    alone = collate([Example(trajectories[0], 1.0, recorded_behaviour(trajectories[0]))], pad_id=0, pack=True)
    assert alone.packed is None


def test_packed_micro_batches_count_rows_not_examples() -> None:
    examples = [Example(make_trajectory(str(n), [1] * n, [2]), 1.0, []) for n in (9, 4, 4, 1)]
    padded = [[e.length for e in g] for g in micro_batches(examples, max_tokens=20)]
    packed = [[e.length for e in g] for g in micro_batches(examples, max_tokens=20, pack=True)]
    assert padded == [[10, 5], [5, 2]]
    assert packed == [[10, 5, 5], [2]]  # rows [10] and [5, 5]: 20 tokens; the 2 would need a third row
