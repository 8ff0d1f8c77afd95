"""A step whose size answers to its signal (issue 35, ``--step-floor``) on hand-built logits.

A fresh AdamW moves every weight by ±lr on its first step whatever the gradient's size:
700 noisy teacher-student tokens then move the adapter as far as 25,000 graded ones.
With the floor, a weak gradient takes a proportionally small step; a strong one still lr.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.checkpoint import save_optimizer
from trainer.policy import TrainConfig, build_optimizer
from trainer.sdpo import sdpo_token_loss

LOGGED = torch.tensor([[0, 2, 1]])
MASK = torch.tensor([[0.0, 1.0, 1.0]])
STUDENT = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.1, 1.0, -1.0, 0.0], [0.2, 0.3, -0.4, 1.2, 0.0]]])
LR = 0.01


def _logged_logp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, LOGGED.unsqueeze(-1)).squeeze(-1)


def _first_step(signal: float, floor: float) -> float:
    """How far one fresh-optimiser step moves the logits, the teacher preferring each logged token by ``signal``."""
    logits = torch.nn.Parameter(STUDENT.clone())
    opt = build_optimizer([logits], TrainConfig(lr=LR, step_floor=floor))
    logp = _logged_logp(logits)
    prox = logp.detach()
    sdpo_token_loss(logp, prox + signal, prox, prox.clone(), MASK, n_tokens=2).backward()
    opt.step()
    return float((logits.detach() - STUDENT).abs().max())


def test_without_the_floor_a_weak_signal_moves_the_weights_as_far_as_a_strong_one() -> None:
    assert _first_step(1e-3, 0.0) == pytest.approx(_first_step(1.0, 0.0), rel=1e-3)
    assert _first_step(1.0, 0.0) == pytest.approx(LR, rel=1e-3)


def test_with_the_floor_the_step_answers_to_the_signal() -> None:
    weak, strong = _first_step(1e-3, 1e-2), _first_step(1.0, 1e-2)
    assert strong == pytest.approx(LR, rel=0.05)  # a strong gradient still takes (about) the full step
    assert weak < strong / 20  # a gradient a thousand times weaker takes a far smaller one
    assert _first_step(2e-3, 1e-2) == pytest.approx(2 * weak, rel=0.05)  # below the floor: in proportion


def test_moments_carried_over_keep_this_runs_floor(tmp_path: Path) -> None:
    logits = torch.nn.Parameter(STUDENT.clone())
    old = build_optimizer([logits], TrainConfig(lr=LR))
    logits.grad = torch.ones_like(logits)
    old.step()
    save_optimizer(old, tmp_path)
    resumed = build_optimizer([logits], TrainConfig(lr=0.5 * LR, step_floor=1e-3), tmp_path)
    assert resumed.state[logits]["step"] == 1  # the moments came along
    assert resumed.param_groups[0]["eps"] == 1e-3 and resumed.param_groups[0]["lr"] == 0.5 * LR
