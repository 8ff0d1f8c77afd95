"""The per-token log-ratio clip (issue 35) on hand-built logits: beyond ±c a teacher pushes no harder."""

from __future__ import annotations

import pytest
import torch

from trainer.sdpo import sdpo_token_loss, sdpo_topk_loss, token_signal

LOGGED = torch.tensor([[0, 2, 1]])
MASK = torch.tensor([[0.0, 1.0, 1.0]])
STUDENT = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.1, 1.0, -1.0, 0.0], [0.2, 0.3, -0.4, 1.2, 0.0]]])


def _logged_logp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, LOGGED.unsqueeze(-1)).squeeze(-1)


def _boosted(boost: float) -> torch.Tensor:
    """Teacher logits: the student's with the logged token's moved by ``boost`` (< 0: the teacher dislikes it)."""
    return STUDENT.scatter_add(-1, LOGGED.unsqueeze(-1), torch.full(LOGGED.unsqueeze(-1).shape, boost))


def _token_grad(boost: float, signal_clip: float) -> torch.Tensor:
    logits = STUDENT.clone().requires_grad_(True)
    logp = _logged_logp(logits)
    prox = logp.detach()
    loss = sdpo_token_loss(logp, _logged_logp(_boosted(boost)), prox, prox.clone(), MASK, 2, signal_clip=signal_clip)
    loss.backward()
    assert logits.grad is not None
    return logits.grad


def _topk_grad(boost: float, signal_clip: float) -> torch.Tensor:
    logits = STUDENT.clone().requires_grad_(True)
    s = torch.log_softmax(logits, -1)
    prox = _logged_logp(logits).detach()
    t = torch.log_softmax(_boosted(boost), -1)
    sdpo_topk_loss(s, t, prox, prox.clone(), MASK, 2, k=3, signal_clip=signal_clip).backward()
    assert logits.grad is not None
    return logits.grad


def test_token_signal_is_clamped_to_plus_minus_c() -> None:
    student = torch.tensor([[-1.0, -2.0, -3.0]])
    teacher = torch.tensor([[-0.5, -9.0, 4.0]])  # log-ratios 0.5, −7, 7
    assert token_signal(student, teacher, clip=2.0).tolist() == [[0.5, -2.0, 2.0]]
    assert token_signal(student, teacher).tolist() == [[0.5, -7.0, 7.0]]  # 0: unclipped


@pytest.mark.parametrize("grad", [_token_grad, _topk_grad])
def test_beyond_the_clip_a_stronger_teacher_pushes_no_harder(grad: object) -> None:
    fn = grad  # type: ignore[assignment]
    far, farther = fn(-8.0, 1.0), fn(-30.0, 1.0)  # type: ignore[operator]
    unclipped_far, unclipped_farther = fn(-8.0, 0.0), fn(-30.0, 0.0)  # type: ignore[operator]
    # Clipped to 1, both teachers give (all but) the same push; unclipped, the farther one pushes far harder.
    # (Top-k: the other buckets renormalise by e^-8 of the disliked one's mass: not exactly equal.)
    assert float((far - farther).abs().sum()) < 1e-2 * float((unclipped_farther - unclipped_far).abs().sum())
    assert float(unclipped_farther.abs().sum()) > float(unclipped_far.abs().sum()) * 1.2
    assert float(far.abs().sum()) < float(unclipped_far.abs().sum())


def test_within_the_clip_the_signal_is_unchanged() -> None:
    torch.testing.assert_close(_token_grad(0.5, 2.0), _token_grad(0.5, 0.0))
