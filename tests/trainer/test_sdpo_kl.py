"""The KL constraint to the serving version (issue 35) on hand-built logits."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.sdpo import kl_to_reference, sdpo_token_loss

LOGGED = torch.tensor([[0, 2, 1]])
MASK = torch.tensor([[0.0, 1.0, 1.0]])
SERVING = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.1, 1.0, -1.0, 0.0], [0.2, 0.3, -0.4, 1.2, 0.0]]])
DRIFTED = SERVING + torch.tensor([0.0, 0.0, 1.5, 0.0, 0.0])  # the student has moved: token 2 likelier everywhere


def _logged_logp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, LOGGED.unsqueeze(-1)).squeeze(-1)


def test_the_kl_is_zero_with_zero_gradient_where_the_student_is_the_serving_version() -> None:
    logits = SERVING.clone().requires_grad_(True)
    logp = _logged_logp(logits)
    loss = kl_to_reference(logp, _logged_logp(SERVING), torch.ones_like(MASK), MASK, 2)
    loss.backward()
    assert float(loss) == 0.0
    assert logits.grad is not None and float(logits.grad.abs().max()) == 0.0


def test_the_k3_estimate_by_hand() -> None:
    logp = torch.tensor([[0.0, math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[0.0, math.log(0.25), math.log(0.4)]])  # r = 0.5, 2
    expected = ((0.5 - 1 - math.log(0.5)) + (2 - 1 - math.log(2))) / 2
    assert float(kl_to_reference(logp, ref, torch.ones_like(MASK), MASK, 2)) == pytest.approx(expected)


def test_with_a_teacher_that_teaches_nothing_the_kl_alone_pulls_the_student_back_to_serving() -> None:
    ref = _logged_logp(SERVING)

    def step(kl: float) -> torch.Tensor:
        logits = DRIFTED.clone().requires_grad_(True)
        logp = _logged_logp(logits)
        prox = logp.detach()
        # teacher = student: zero self-distillation signal; only the KL can move anything
        loss = sdpo_token_loss(logp, prox, prox, prox.clone(), MASK, 2, ref_logp=ref, kl=kl)
        loss.backward()
        assert logits.grad is not None
        with torch.no_grad():
            return _logged_logp(logits - 1.0 * logits.grad)

    before = (_logged_logp(DRIFTED) - ref).abs()[0, 1:]
    pulled = (step(1.0) - ref).abs()[0, 1:]
    assert bool((pulled < before).all()), (before, pulled)
    torch.testing.assert_close(step(0.0), _logged_logp(DRIFTED))  # no KL: nothing moves


def test_the_kl_is_weighted_like_the_signal() -> None:
    logp = _logged_logp(DRIFTED)
    ref = _logged_logp(SERVING)
    full = kl_to_reference(logp, ref, torch.ones_like(MASK), MASK, 2)
    half = kl_to_reference(logp, ref, torch.full_like(MASK, 0.5), MASK, 2)
    assert float(full) > 0 and float(half) == pytest.approx(float(full) / 2)
