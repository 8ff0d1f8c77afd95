"""The losses and ratio metrics on 2 × 3 tensors, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.objective import (
    RatioStats,
    bc_loss,
    in_band,
    ppo_loss,
    reinforce_loss,
    sequence_ratio,
    tis_loss,
    token_ratio,
)

NAN = math.nan
LN2 = math.log(2.0)
LN15 = math.log(1.5)


def _setup() -> tuple[torch.Tensor, ...]:
    # Two sequences of three tokens; token 0 of each is context (mask 0).
    logp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -1.5]], requires_grad=True)
    prox = logp.detach().clone()
    # Sequence 0: μ below π_prox by ln 1.5 then 2 ln 2 → ratios 1.5 and 4. Sequence 1: μ unknown on one token.
    behav = torch.tensor([[NAN, -1.0 - LN15, -2.0 - 2 * LN2], [NAN, -0.5, NAN]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -2.0])
    return logp, prox, behav, mask, adv


def test_token_ratio_is_one_where_mu_is_unknown() -> None:
    _, prox, behav, _, _ = _setup()
    r = token_ratio(prox, behav)
    assert r[0, 1:].tolist() == pytest.approx([1.5, 4.0])
    assert r[1, 1:].tolist() == pytest.approx([1.0, 1.0])


def test_tis_loss_truncates_the_weight_at_c() -> None:
    logp, prox, behav, mask, adv = _setup()
    loss = tis_loss(logp, prox, behav, mask, adv, n_tokens=4, clip=2.0)
    # −(1/4)[1·(1.5·−1 + 2·−2) + (−2)·(1·−0.5 + 1·−1.5)] = −(1/4)(−5.5 + 4) = 0.375
    assert float(loss) == pytest.approx(0.375)
    loss.backward()
    assert logp.grad is not None
    # d/dlogp = −m·w·A/N
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.375, -0.5], [0.0, 0.5, 0.5]]))


def test_reinforce_and_bc_ignore_mu() -> None:
    logp, _, _, mask, adv = _setup()
    # −(1/4)[1·(−3) + (−2)·(−2)] = −0.25
    assert float(reinforce_loss(logp, mask, adv, n_tokens=4)) == pytest.approx(-0.25)
    # −(1/4)(−1 − 2 − 0.5 − 1.5) = 1.25
    assert float(bc_loss(logp, mask, n_tokens=4)) == pytest.approx(1.25)


def test_ppo_gradient_equals_tis_at_the_proximal_point() -> None:
    logp, prox, behav, mask, adv = _setup()
    ppo_loss(logp, prox, behav, mask, adv, n_tokens=4, clip=2.0).backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.375, -0.5], [0.0, 0.5, 0.5]]))


def test_ppo_clips_the_proximal_ratio() -> None:
    prox = torch.tensor([[0.0, -1.0]])
    behav = prox.clone()  # on-policy: behaviour weight 1
    mask = torch.tensor([[0.0, 1.0]])
    # π_θ/π_prox = e^0.5 ≈ 1.65 > 1.2: with A > 0 the clipped term (1.2·A) wins and has no gradient.
    logp = torch.tensor([[0.0, -0.5]], requires_grad=True)
    loss = ppo_loss(logp, prox, behav, mask, torch.tensor([1.0]), n_tokens=1, eps=0.2)
    assert float(loss) == pytest.approx(-1.2)
    loss.backward()
    assert logp.grad is not None and float(logp.grad[0, 1]) == 0.0
    # With A < 0 the unclipped term is the minimum: −(e^0.5 · −1).
    logp2 = torch.tensor([[0.0, -0.5]], requires_grad=True)
    assert float(ppo_loss(logp2, prox, behav, mask, torch.tensor([-1.0]), n_tokens=1)) == pytest.approx(math.exp(0.5))


def test_sequence_ratio_is_the_geometric_mean_over_known_tokens() -> None:
    _, prox, behav, mask, _ = _setup()
    ratio = sequence_ratio(prox, behav, mask)
    assert ratio.tolist() == pytest.approx([math.sqrt(1.5 * 4), 1.0])
    assert in_band(ratio, (0.5, 2.0)).tolist() == [False, True]
    assert sequence_ratio(prox, torch.full_like(behav, NAN), mask).tolist() == [1.0, 1.0]


def test_ratio_stats_summaries() -> None:
    _, prox, behav, mask, _ = _setup()
    stats = RatioStats()
    stats.add(prox, behav, mask, clip=2.0)
    s = stats.summary()
    # Known tokens: ratios 1.5, 4, 1.
    assert stats.tokens == 3
    assert s["ratio_mean"] == pytest.approx(6.5 / 3)
    assert s["ratio_max"] == pytest.approx(4.0)
    assert s["clipped_frac"] == pytest.approx(1 / 3)
    assert s["ess"] == pytest.approx(6.5**2 / (3 * (1.5**2 + 4**2 + 1)))
    k3 = (1.5 - 1 - LN15) + (4 - 1 - 2 * LN2) + 0.0
    assert s["kl_mu_pi"] == pytest.approx(k3 / 3)


def test_on_policy_stats_are_neutral() -> None:
    prox = torch.tensor([[0.0, -1.0, -2.0]])
    stats = RatioStats()
    stats.add(prox, prox.clone(), torch.tensor([[0.0, 1.0, 1.0]]), clip=2.0)
    s = stats.summary()
    assert (s["ratio_mean"], s["ratio_max"], s["clipped_frac"], s["ess"]) == pytest.approx((1, 1, 0, 1))
    assert s["kl_mu_pi"] == pytest.approx(0.0)
    assert RatioStats().summary()["ess"] == 1.0
