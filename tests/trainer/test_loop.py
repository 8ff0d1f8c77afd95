"""One training step on the tiny model: ratios, rejection, missing μ, objectives, exclusions."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from storage.trajectories import Trajectory
from tests.trainer.helpers import make_trajectory, random_tokens
from trainer.advantages import TaskBaseline
from trainer.batch import Example, collate, recorded_behaviour
from trainer.errors import BaseModelError
from trainer.loop import _fill_behaviour, _score, train_step
from trainer.objective import ObjectiveConfig
from trainer.policy import Policy, TrainConfig, check_weights, load_policy
from trainer.publish import adapter_dir, save_adapter

SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": -1, "min_p": 0.0}


def _cfg(name: str = "tis", **kw: object) -> TrainConfig:
    epochs = 3 if name == "ppo" else 1
    kw = {"lr": 2e-2, **kw}
    return TrainConfig(model="tiny", threads=1, objective=ObjectiveConfig(name=name, epochs=epochs), **kw)  # type: ignore[arg-type]


def _trajectories(n: int, seed: int = 0, **kw: object) -> list[Trajectory]:
    rng = random.Random(seed)
    return [
        make_trajectory(
            f"t{seed}-{i}",
            random_tokens(rng, 10),
            random_tokens(rng, 6),
            reward=float(i % 2),
            sampling=SAMPLING,
            group="g",
            **kw,
        )  # type: ignore[arg-type]
        for i in range(n)
    ]


def _score_all(policy: Policy, trajectories: list[Trajectory]) -> torch.Tensor:
    batch = collate([Example(t, 0.0, recorded_behaviour(t)) for t in trajectories], policy.pad_id, policy.device)
    with torch.no_grad():
        return _score(policy, batch).sum(dim=1)


def _on_policy(policy: Policy, trajectories: list[Trajectory], shift: float = 0.0) -> None:
    """Record μ as the policy's own processed logprobs (minus ``shift`` per token)."""
    batch = collate([Example(t, 0.0, recorded_behaviour(t)) for t in trajectories], policy.pad_id, policy.device)
    with torch.no_grad():
        lp = _score(policy, batch)
    for row, t in enumerate(trajectories):
        t.logprobs = [float(lp[row, j]) - shift if t.mask[j] else None for j in range(len(t.token_ids))]


@pytest.fixture
def policy() -> Policy:
    return load_policy(_cfg())


def test_on_policy_step_has_unit_ratios_and_follows_the_advantage(policy: Policy) -> None:
    trajectories = _trajectories(6)
    _on_policy(policy, trajectories)
    before = _score_all(policy, trajectories)
    result = train_step(policy, trajectories, _cfg(), TaskBaseline())
    m = result.metrics
    assert result.trained and m["trajectories"] == 6 and m["tokens"] == 36
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m["clipped_frac"] == 0.0 and m["ess"] == pytest.approx(1.0) and m["kl_mu_pi"] == pytest.approx(0, abs=1e-6)
    assert m["reward_mean"] == 0.5 and math.isfinite(m["loss"])
    assert sorted(result.consumed) == sorted(t.id for t in trajectories)
    delta = _score_all(policy, trajectories) - before
    assert all(float(d) > 0 for d in delta[1::2]) and all(float(d) < 0 for d in delta[0::2])
    assert policy.dirty


def test_far_off_policy_sequences_are_rejected_and_counted(policy: Policy) -> None:
    trajectories = _trajectories(4)
    _on_policy(policy, trajectories)
    _on_policy(policy, trajectories[:1], shift=2.0)  # π/μ = e² per token: outside [0.5, 2]
    result = train_step(policy, trajectories, _cfg(), TaskBaseline())
    assert result.excluded["ratio_out_of_band"] == 1
    assert result.metrics["trajectories"] == 3
    assert result.metrics["ratio_max"] == pytest.approx(math.exp(2), rel=1e-4)
    assert result.metrics["clipped_frac"] == pytest.approx(6 / 24)
    assert "t0-0" in result.consumed  # never offered again


def test_missing_mu_with_an_unknown_adapter_keeps_only_positive_advantages(policy: Policy) -> None:
    trajectories = _trajectories(4, adapter_version=7)  # v7 is in no adapter map
    _on_policy(policy, trajectories)
    for t in trajectories[:2]:
        t.logprobs = [None] * len(t.token_ids)
    result = train_step(policy, trajectories, _cfg(), TaskBaseline())
    # t0 (reward 0, negative advantage) is dropped; t1 (reward 1) is kept with weight 1.
    assert result.excluded["missing_logprobs_unknown_adapter"] == 1
    assert result.metrics["missing_logprobs_positive_only"] == 1
    assert result.metrics["trajectories"] == 3


def test_missing_mu_from_the_loaded_weights_needs_no_recomputation(policy: Policy) -> None:
    trajectories = _trajectories(2)
    for t in trajectories:
        t.logprobs = [None] * len(t.token_ids)
    result = train_step(policy, trajectories, _cfg(), TaskBaseline())
    assert result.metrics["recomputed_logprobs"] == 2 and result.metrics["trajectories"] == 2
    assert result.metrics["ratio_max"] == pytest.approx(1.0)


def test_missing_mu_is_recomputed_with_the_serving_adapter(policy: Policy, tmp_path: Path) -> None:
    cfg = _cfg()
    warmup = _trajectories(4, seed=1)
    _on_policy(policy, warmup)
    train_step(policy, warmup, cfg, TaskBaseline())
    v1 = save_adapter(policy.model, adapter_dir(tmp_path, "p", "a", 1))
    policy.version, policy.dirty = 1, False
    _on_policy(policy, warmup)
    train_step(policy, warmup, cfg, TaskBaseline())  # now the weights are neither base nor v1
    assert policy.dirty
    served_by_v1 = _trajectories(1, seed=2, adapter_version=1)
    served_by_base = _trajectories(1, seed=3, adapter_version=None)
    for t in served_by_v1 + served_by_base:
        t.logprobs = [None] * len(t.token_ids)
    examples = [Example(t, 1.0, recorded_behaviour(t)) for t in served_by_v1 + served_by_base]
    current = {k: v.clone() for k, v in policy.model.state_dict().items() if "lora" in k}
    _fill_behaviour(policy, examples, {1: v1}, cfg)
    for k, v in policy.model.state_dict().items():
        if "lora" in k:
            assert torch.equal(v, current[k]), f"{k} was not restored"
    reference = load_policy(TrainConfig(model="tiny", threads=1), v1, 1)
    expected_v1 = _score_all(reference, served_by_v1)
    with reference.model.disable_adapter():
        expected_base = _score_all(reference, served_by_base)
    got = [sum(v for v in e.behaviour if not math.isnan(v)) for e in examples]
    assert got == pytest.approx([float(expected_v1[0]), float(expected_base[0])], abs=1e-4)
    served_by_base[0].reward = 1.0  # the two attempts differ: nonzero advantages, so both are scored
    result = train_step(policy, served_by_v1 + served_by_base, cfg, TaskBaseline(), {1: v1})
    assert result.metrics["recomputed_logprobs"] == 2 and result.metrics["kl_mu_pi"] > 0


def test_screening_exclusions_and_what_is_used_up(policy: Policy) -> None:
    trajectories = _trajectories(3)
    _on_policy(policy, trajectories)
    rng = random.Random(5)
    long = make_trajectory("long", random_tokens(rng, 40), random_tokens(rng, 4), sampling=SAMPLING)
    ungraded = make_trajectory("later", [1, 2], [3], reward=None)
    result = train_step(policy, [*trajectories, long, ungraded], _cfg(max_len=32), TaskBaseline())
    assert result.excluded == {"too_long": 1, "ungraded": 1}
    assert "long" in result.consumed and "later" not in result.consumed


def test_nothing_to_train_takes_no_step(policy: Policy) -> None:
    before = [p.clone() for p in policy.parameters()]
    result = train_step(policy, [make_trajectory("x", [1], [2], reward=None)], _cfg(), TaskBaseline())
    assert not result.trained and result.metrics["loss"] is None
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


def test_ppo_takes_several_epochs(policy: Policy) -> None:
    trajectories = _trajectories(4)
    _on_policy(policy, trajectories)
    before = _score_all(policy, trajectories)
    result = train_step(policy, trajectories, _cfg("ppo"), TaskBaseline())
    assert result.trained and result.metrics["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    delta = _score_all(policy, trajectories) - before
    assert float(delta[1]) > 0 and float(delta[0]) < 0


def test_bc_clones_only_trajectories_above_the_threshold(policy: Policy) -> None:
    trajectories = _trajectories(4)
    before = _score_all(policy, trajectories)
    result = train_step(policy, trajectories, _cfg("bc"), TaskBaseline())
    assert result.excluded["below_threshold"] == 2 and result.metrics["trajectories"] == 2
    delta = _score_all(policy, trajectories) - before
    assert float(delta[1]) > 0 and float(delta[3]) > 0


def test_baseline_is_used_for_lone_attempts(policy: Policy) -> None:
    trajectories = _trajectories(2)
    for t in trajectories:
        t.group, t.task_id = None, "task"
    _on_policy(policy, trajectories)
    baseline = TaskBaseline()
    train_step(policy, trajectories, _cfg(), baseline)
    assert baseline.get("task") == pytest.approx(0.5)


def test_modified_base_weights_are_refused(tmp_path: Path) -> None:
    from engine.weights import resolve_model

    info = resolve_model("tiny")
    fake = type(info)(path=info.path, name=info.name, sha256="0" * 64)
    with pytest.raises(BaseModelError, match="hash"):
        check_weights(fake)


def test_a_child_run_continues_the_parents_optimiser_moments(policy: Policy, tmp_path: Path) -> None:
    trajectories = _trajectories(6)
    _on_policy(policy, trajectories)
    assert train_step(policy, trajectories, _cfg(), TaskBaseline()).trained
    folder = save_adapter(policy.model, adapter_dir(tmp_path, "p", "a", 1), policy.optimizer)
    saved = policy.optimizer.state_dict()["state"]

    child = load_policy(_cfg(lr=1e-3), folder, 1)
    state = child.optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 1e-3  # this run's learning rate, not the parent's
    assert set(state["state"]) == set(saved) and len(saved) == len(child.parameters())
    for i, moments in saved.items():
        assert torch.equal(state["state"][i]["exp_avg_sq"], moments["exp_avg_sq"])
        assert int(state["state"][i]["step"]) == 1

    fresh = load_policy(_cfg(resume_optimizer=False), folder, 1)
    assert fresh.optimizer.state_dict()["state"] == {}
    # An adapter saved without its optimiser (older versions, other tools) starts AdamW afresh.
    bare = save_adapter(policy.model, adapter_dir(tmp_path, "p", "a", 2))
    assert load_policy(_cfg(), bare, 2).optimizer.state_dict()["state"] == {}


def test_zero_advantage_examples_skip_the_forward_pass_but_not_the_denominator() -> None:
    """Tasks whose attempts all scored alike add no gradient: skipping them gives the same step."""
    from trainer.advantages import compute_advantages
    from trainer.loop import _single_pass

    mixed = _trajectories(4, seed=1)  # rewards 0, 1, 0, 1 in group "g": nonzero advantages
    alike = _trajectories(4, seed=2)
    for t in alike:
        t.reward, t.group = 1.0, "same"  # all four attempts scored alike: advantage 0
    batch = mixed + alike
    cfg = _cfg(grad_clip=0.0)  # plain SGD below, unclipped: the update is the gradient, scale included
    skipping, computing = load_policy(cfg), load_policy(cfg)
    for p in (skipping, computing):
        _on_policy(p, batch)
        p.optimizer = torch.optim.SGD(p.parameters(), lr=1.0)
    result = train_step(skipping, batch, cfg, TaskBaseline())
    m = result.metrics
    assert result.trained and m["trajectories"] == 8
    assert (m["zero_advantage_trajectories"], m["zero_advantage_tokens"]) == (4, 24)
    assert sorted(result.consumed) == sorted(t.id for t in batch)  # the skipped ones are used up too

    # The same step computing every example (what the trainer did before skipping).
    advantages = compute_advantages(
        [float(t.reward) for t in batch], [t.group for t in batch], [t.task_id for t in batch], TaskBaseline()
    )
    assert advantages[4:] == [0.0] * 4 and all(a != 0 for a in advantages[:4])
    _single_pass(computing, [Example(t, a, recorded_behaviour(t)) for t, a in zip(batch, advantages, strict=True)], cfg)
    untouched = load_policy(cfg).parameters()
    for a, b, c in zip(skipping.parameters(), computing.parameters(), untouched, strict=True):
        assert torch.allclose(a - c, b - c, atol=1e-7, rtol=1e-4), "skipping zero-advantage examples changed the update"
    assert any(not torch.equal(a, c) for a, c in zip(skipping.parameters(), untouched, strict=True))
