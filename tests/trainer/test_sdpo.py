"""Self-distillation and correction losses on hand-built logits, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.objective import tis_loss
from trainer.sdpo import (
    CORRECTION_EMPTY,
    CORRECTION_SAME,
    CORRECTION_TOO_LONG,
    HINT_TEMPLATE,
    align,
    correction_exclusion,
    correction_loss,
    correction_messages,
    sdpo_token_loss,
    sdpo_topk_loss,
    signal_mean,
    teacher_messages,
    teacher_sequence,
    topk_pair,
    with_tail,
)

NAN = math.nan
LN15 = math.log(1.5)
LN4 = math.log(4.0)

# One sequence of three positions over a 5-token vocabulary; position 0 is context.
LOGGED = torch.tensor([[0, 2, 1]])
MASK = torch.tensor([[0.0, 1.0, 1.0]])
STUDENT = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.1, 1.0, -1.0, 0.0], [0.2, 0.3, -0.4, 1.2, 0.0]]])


def _logged_logp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, LOGGED.unsqueeze(-1)).squeeze(-1)


def _prefers_logged(logits: torch.Tensor, boost: float = 2.0) -> torch.Tensor:
    """The same logits with the logged token's raised: a teacher that likes what was sampled."""
    return logits.scatter_add(-1, LOGGED.unsqueeze(-1), torch.full(LOGGED.unsqueeze(-1).shape, boost))


def _on_policy(logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    prox = logp.detach()
    return prox, prox.clone()  # μ = π_prox: weight 1


# --------------------------------------------------------------------------- teacher equal to student


@pytest.mark.parametrize("form", ["token", "topk"])
def test_a_teacher_equal_to_the_student_gives_zero_gradient(form: str) -> None:
    logits = STUDENT.clone().requires_grad_(True)
    teacher = STUDENT.clone()
    logp = _logged_logp(logits)
    prox, behav = _on_policy(logp)
    if form == "token":
        loss = sdpo_token_loss(logp, _logged_logp(teacher), prox, behav, MASK, n_tokens=2)
    else:
        loss = sdpo_topk_loss(
            torch.log_softmax(logits, -1), torch.log_softmax(teacher, -1), prox, behav, MASK, n_tokens=2, k=2
        )
    loss.backward()
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, torch.zeros_like(logits), atol=1e-7, rtol=0)
    assert float(loss) == pytest.approx(0.0, abs=1e-7)


# --------------------------------------------------------------------------- a teacher that prefers y_t


@pytest.mark.parametrize("form", ["token", "topk"])
def test_a_teacher_preferring_the_logged_token_pushes_its_probability_up(form: str) -> None:
    logits = STUDENT.clone().requires_grad_(True)
    teacher = _prefers_logged(STUDENT)
    before = _logged_logp(STUDENT)
    opt = torch.optim.SGD([logits], lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        logp = _logged_logp(logits)
        prox, behav = _on_policy(logp)
        if form == "token":
            loss = sdpo_token_loss(logp, _logged_logp(teacher), prox, behav, MASK, n_tokens=2)
        else:
            loss = sdpo_topk_loss(
                torch.log_softmax(logits, -1), torch.log_softmax(teacher, -1), prox, behav, MASK, n_tokens=2, k=3
            )
        loss.backward()
        opt.step()
    after = _logged_logp(logits.detach())
    assert bool((after[0, 1:] > before[0, 1:]).all()), (before, after)


def test_a_teacher_disliking_the_logged_token_pushes_its_probability_down() -> None:
    logits = STUDENT.clone().requires_grad_(True)
    teacher = _prefers_logged(STUDENT, boost=-2.0)
    logp = _logged_logp(logits)
    prox, behav = _on_policy(logp)
    sdpo_token_loss(logp, _logged_logp(teacher), prox, behav, MASK, n_tokens=2).backward()
    with torch.no_grad():
        after = _logged_logp(logits - 0.5 * logits.grad)  # type: ignore[operator]
    assert bool((after[0, 1:] < _logged_logp(STUDENT)[0, 1:]).all())


def test_the_teacher_gets_no_gradient() -> None:
    logits = STUDENT.clone().requires_grad_(True)
    teacher_logits = _prefers_logged(STUDENT).requires_grad_(True)
    logp = _logged_logp(logits)
    prox, behav = _on_policy(logp)
    loss = sdpo_token_loss(logp, _logged_logp(teacher_logits), prox, behav, MASK, n_tokens=2)
    loss = loss + sdpo_topk_loss(
        torch.log_softmax(logits, -1), torch.log_softmax(teacher_logits, -1), prox, behav, MASK, n_tokens=2
    )
    loss.backward()
    assert teacher_logits.grad is None


# --------------------------------------------------------------------------- behaviour weights (TIS)


def test_token_loss_truncates_the_behaviour_weight_like_tis() -> None:
    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[0.0, -0.5, -3.0]])  # advantages +0.5, −1
    prox = logp.detach().clone()
    behav = torch.tensor([[NAN, -1.0 - LN15, -2.0 - LN4]])  # ratios 1.5 and 4 → weights 1.5 and C = 2
    loss = sdpo_token_loss(logp, teacher, prox, behav, MASK, n_tokens=2, clip=2.0)
    # −(1/2)[1.5·0.5·(−1) + 2·(−1)·(−2)] = −(1/2)(−0.75 + 4) = −1.625
    assert float(loss) == pytest.approx(-1.625)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.375, 1.0]]))
    # Same weights as TIS: with the teacher's signal as a per-token advantage, the gradients agree.
    again = logp.detach().clone().requires_grad_(True)
    tis_loss(again, prox, behav, MASK, torch.tensor([1.0]), n_tokens=2, clip=2.0).backward()
    assert again.grad is not None
    torch.testing.assert_close(logp.grad, again.grad * torch.tensor([[0.0, 0.5, -1.0]]))


def test_topk_loss_truncates_the_behaviour_weight() -> None:
    student = torch.log_softmax(STUDENT, -1)
    teacher = torch.log_softmax(_prefers_logged(STUDENT), -1)
    prox = _logged_logp(STUDENT)
    kl = sdpo_topk_loss(student, teacher, prox, prox, MASK, n_tokens=1, k=3)  # weight 1 everywhere
    far = prox - torch.tensor([[0.0, 10.0, 10.0]])  # μ far below π_prox: ratio e^10, truncated at C
    assert float(sdpo_topk_loss(student, teacher, prox, far, MASK, n_tokens=1, k=3, clip=2.0)) == pytest.approx(
        2 * float(kl)
    )
    unknown = torch.full_like(prox, NAN)  # μ unknown: weight 1
    assert float(sdpo_topk_loss(student, teacher, prox, unknown, MASK, n_tokens=1, k=3)) == pytest.approx(float(kl))


# --------------------------------------------------------------------------- top-k plus tail


def test_tail_bucket_completes_the_distribution() -> None:
    full = torch.log_softmax(STUDENT, -1)
    s, t = topk_pair(full, torch.log_softmax(_prefers_logged(STUDENT), -1), k=2)
    assert s.shape == (1, 3, 3)
    torch.testing.assert_close(s.exp().sum(-1), torch.ones(1, 3))
    torch.testing.assert_close(t.exp().sum(-1), torch.ones(1, 3))
    # The student's two most likely tokens at position 1 are 2 and 0, in that order.
    torch.testing.assert_close(s[0, 1, :2], full[0, 1, [2, 0]])
    assert with_tail(full).shape[-1] == 6  # k = V: the tail is (numerically) empty but present


def test_topk_with_every_token_is_the_exact_reverse_kl() -> None:
    student = torch.log_softmax(STUDENT, -1)
    teacher = torch.log_softmax(_prefers_logged(STUDENT), -1)
    ones = torch.zeros(1, 3)
    exact = (student.exp() * (student - teacher)).sum(-1)
    got = sdpo_topk_loss(student, teacher, ones, ones, MASK, n_tokens=1, k=5)
    assert float(got) == pytest.approx(float((exact * MASK).sum()), abs=1e-5)


# --------------------------------------------------------------------------- corrections


def test_correction_sft_raises_the_corrected_tokens() -> None:
    logits = STUDENT.clone().requires_grad_(True)
    before = _logged_logp(STUDENT)
    loss = correction_loss(_logged_logp(logits), MASK, n_tokens=2)
    assert float(loss) == pytest.approx(-float((before * MASK).sum()) / 2)
    loss.backward()
    with torch.no_grad():
        after = _logged_logp(logits - 0.5 * logits.grad)  # type: ignore[operator]
    assert bool((after[0, 1:] > before[0, 1:]).all())


def test_correction_filter() -> None:
    assert correction_exclusion("  ", "x") == CORRECTION_EMPTY
    assert correction_exclusion(None, "x") == CORRECTION_EMPTY
    assert correction_exclusion("ANSWER: 7", "ANSWER:  7\n") == CORRECTION_SAME
    assert correction_exclusion("x" * 20, None, max_chars=10) == CORRECTION_TOO_LONG
    assert correction_exclusion("ANSWER: 7", "ANSWER: 9") is None


# --------------------------------------------------------------------------- contexts from stored records


def test_teacher_prompt_is_the_request_then_the_feedback_as_a_hint_turn() -> None:
    request = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "CALC: 2+3"},
        {"role": "tool", "content": "5", "tool_call_id": "c1"},
    ]
    out = teacher_messages(request, "  wrong operation  ")
    assert out[:-1] == request and out[:-1] is not request
    assert out[-1] == {"role": "user", "content": HINT_TEMPLATE.format(feedback="wrong operation")}
    out[0]["content"] = "changed"
    assert request[0]["content"] == "Be brief."  # the stored request is never modified
    with pytest.raises(ValueError):
        teacher_messages(request, " ")
    assert correction_messages(request, " ANSWER: 5 ")[-1] == {"role": "assistant", "content": "ANSWER: 5"}


def test_teacher_sequence_appends_the_logged_ids_and_aligns_to_the_student() -> None:
    ids, mask = teacher_sequence([1, 2, 3, 4, 5], [9, 8])
    assert ids == [1, 2, 3, 4, 5, 9, 8] and mask == [0, 0, 0, 0, 0, 1, 1]
    teacher = torch.tensor([[0.0, 0, 0, 0, 0, -0.1, -0.2]])
    student_mask = torch.tensor([[0.0, 0, 1, 1]])
    aligned = align(teacher, torch.tensor([mask], dtype=torch.float32), student_mask)
    torch.testing.assert_close(aligned, torch.tensor([[0.0, 0.0, -0.1, -0.2]]))
    with pytest.raises(ValueError):
        align(teacher, torch.tensor([mask], dtype=torch.float32), torch.tensor([[0.0, 0, 0, 1]]))
    assert signal_mean(torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[5.0, -0.5, -1.0]]), MASK) == pytest.approx(
        0.75
    )


def test_a_centred_signal_pushes_nothing_down_when_the_teacher_dislikes_every_logged_token() -> None:
    """Shown any feedback, a teacher may find every logged token a little less likely (a shift of the
    whole signal, −0.5 here): uncentred, that pushes every token down; centred, only the difference
    between tokens is left (the first token is disliked less than the second, so it goes up)."""
    logits = STUDENT.clone().requires_grad_(True)
    logp = _logged_logp(logits)
    teacher = logp.detach() + torch.tensor([[0.0, -0.3, -0.7]])  # both logged tokens less likely
    prox, behav = _on_policy(logp)
    plain = sdpo_token_loss(logp, teacher, prox, behav, MASK, n_tokens=2)
    centred = sdpo_token_loss(logp, teacher, prox, behav, MASK, n_tokens=2, center=True)
    # loss = −(1/2) Σ adv · log π: adv is (−0.3, −0.7) plain, (+0.2, −0.2) centred on the mean −0.5.
    assert float(plain) == pytest.approx(0.5 * (0.3 * float(logp[0, 1]) + 0.7 * float(logp[0, 2])))
    assert float(centred) == pytest.approx(-0.5 * (0.2 * float(logp[0, 1]) - 0.2 * float(logp[0, 2])))
    (grad,) = torch.autograd.grad(centred, logits)
    assert float(grad[0, 1, 2]) < 0 < float(grad[0, 2, 1])  # descent raises token 1's logged logit, lowers 2's
    # A teacher equal to the student still gives zero gradient when centred.
    logp = _logged_logp(logits)
    zero = sdpo_token_loss(logp, logp.detach(), prox, behav, MASK, n_tokens=2, center=True)
    assert torch.autograd.grad(zero, logits)[0].abs().max() == 0
