"""Processed logprobs: temperature, min-p, top-k, top-p as vLLM 0.32 applies them, on hand-made rows."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.logprobs import Sampling, processed_logits, sequence_logprobs, token_logprobs, unsupported


def _row(probs: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([probs], dtype=torch.float32))


def _lp(logits: torch.Tensor, token: int, *, t: float = 1.0, k: int = 0, p: float = 1.0, min_p: float = 0.0) -> float:
    n = logits.shape[0]
    out = token_logprobs(
        logits,
        torch.full((n,), token),
        torch.full((n,), t),
        torch.full((n,), k),
        torch.full((n,), p),
        torch.full((n,), min_p),
    )
    return float(out[0])


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([[0.0, math.log(2.0)]])
    # At T = 0.5 the odds 1:2 become 1:4.
    assert _lp(logits, 1, t=0.5) == pytest.approx(math.log(4 / 5), abs=1e-6)
    assert _lp(logits, 1, t=1.0) == pytest.approx(math.log(2 / 3), abs=1e-6)


def test_greedy_rows_are_unscaled() -> None:
    logits = torch.tensor([[0.0, math.log(2.0)]])
    assert _lp(logits, 1, t=0.0) == pytest.approx(math.log(2 / 3), abs=1e-6)
    assert Sampling.from_dict({"temperature": 0, "top_p": 0.5, "top_k": 3}) == Sampling(temperature=0.0)


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    expected = 3 - math.log(math.exp(3) + math.exp(2))
    assert _lp(logits, 0, k=2) == pytest.approx(expected, abs=1e-6)
    # k = 0 and k = -1 mean "off", as in vLLM.
    full = 3 - math.log(sum(math.exp(x) for x in (3, 1, 2, 0)))
    assert _lp(logits, 0, k=0) == pytest.approx(full, abs=1e-6)
    assert _lp(logits, 0, k=-1) == pytest.approx(full, abs=1e-6)


def test_top_p_renormalises_the_nucleus() -> None:
    logits = _row([0.5, 0.3, 0.15, 0.05])
    # Ascending cumulative sums 0.05, 0.20, 0.50, 1.0: those ≤ 1 − 0.75 go, leaving {0.5, 0.3}.
    assert _lp(logits, 0, p=0.75) == pytest.approx(math.log(0.5 / 0.8), abs=1e-6)
    assert _lp(logits, 1, p=0.75) == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)
    # A tiny p keeps the most likely token only.
    assert _lp(logits, 0, p=0.01) == pytest.approx(0.0, abs=1e-6)


def test_top_p_applies_after_top_k() -> None:
    logits = _row([0.4, 0.3, 0.2, 0.1])
    # top-k 3 renormalises to 4/9, 3/9, 2/9; ascending sums 2/9, 5/9, 1 → p = 0.7 drops 2/9 only.
    assert _lp(logits, 1, k=3, p=0.7) == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)


def test_min_p_drops_tokens_below_a_share_of_the_best() -> None:
    logits = _row([0.5, 0.3, 0.15, 0.05])
    # threshold 0.2 × 0.5 = 0.1 removes the 0.05 token.
    assert _lp(logits, 0, min_p=0.2) == pytest.approx(math.log(0.5 / 0.95), abs=1e-6)


def test_scored_token_stays_in_support_with_a_finite_gradient() -> None:
    logits = _row([0.5, 0.3, 0.15, 0.05]).requires_grad_(True)
    # Token 3 is outside the 0.75-nucleus {0, 1}; it is scored against {0, 1, 3}.
    lp = token_logprobs(logits, torch.tensor([3]), *(torch.tensor([v]) for v in (1.0, 0, 0.75, 0.0)))
    assert float(lp) == pytest.approx(math.log(0.05 / 0.85), abs=1e-6)
    lp.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert float(logits.grad[0, 2]) == 0.0  # the dropped token takes no gradient


def test_rows_carry_their_own_parameters() -> None:
    logits = torch.cat([_row([0.5, 0.3, 0.15, 0.05])] * 2)
    out = token_logprobs(
        logits,
        torch.tensor([1, 1]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([0, 0]),
        torch.tensor([0.75, 1.0]),
        torch.tensor([0.0, 0.0]),
    )
    assert out.tolist() == pytest.approx([math.log(0.3 / 0.8), math.log(0.3)], abs=1e-6)


def test_processed_logits_marks_removed_tokens() -> None:
    logits = _row([0.5, 0.3, 0.15, 0.05])
    out = processed_logits(logits, *(torch.tensor([v]) for v in (1.0, 0, 0.75, 0.0)))
    assert torch.isinf(out[0, 2:]).all() and torch.isfinite(out[0, :2]).all()


def test_sampling_from_recorded_dict() -> None:
    assert Sampling.from_dict({}) == Sampling()
    assert Sampling.from_dict({"temperature": None, "top_k": -1}) == Sampling(top_k=-1)
    assert Sampling.from_dict({"temperature": 0.7, "top_p": 0.9, "min_p": 0.05}) == Sampling(0.7, 0.9, 0, 0.05)


def test_unsupported_names_non_neutral_fields() -> None:
    assert unsupported({"temperature": 0.7, "frequency_penalty": 0.0, "repetition_penalty": 1.0}) == []
    assert unsupported({"frequency_penalty": 0.5, "logit_bias": {"3": 1}}) == ["frequency_penalty", "logit_bias"]
    assert unsupported({"logit_bias": {}, "min_tokens": 0}) == []


class _Bigram(torch.nn.Module):
    """A stand-in causal LM: the logits at t depend only on the token at t."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: torch.Tensor) -> object:
        class Out:
            logits = self.table[input_ids[:, logits_to_keep]]

        return Out()


def test_sequence_logprobs_aligns_targets_with_previous_positions() -> None:
    model = _Bigram(6)
    ids = torch.tensor([[1, 2, 3, 4], [5, 0, 2, 0]])
    score = torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    ones = torch.ones(ids.shape)
    out = sequence_logprobs(model, ids, torch.ones_like(ids), score, ones, torch.zeros_like(ids), ones, 0 * ones)
    full = model.table.log_softmax(-1)
    assert out.positions.tolist() == [[False, False, True, True], [False, True, False, False]]  # t = 0 never
    assert float(out.logprobs[0, 2]) == pytest.approx(float(full[2, 3]), abs=1e-6)
    assert float(out.logprobs[0, 3]) == pytest.approx(float(full[3, 4]), abs=1e-6)
    assert float(out.logprobs[1, 1]) == pytest.approx(float(full[5, 0]), abs=1e-6)
    assert float(out.logprobs[1, 0]) == 0.0 and float(out.logprobs[0, 1]) == 0.0


@pytest.mark.slow
def test_filters_match_vllms_own_implementation() -> None:
    # vLLM is part of this project's install; a trainer-only image (a GPU box) may lack it.
    apply_top_k_top_p_pytorch = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler").apply_top_k_top_p_pytorch

    torch.manual_seed(3)
    logits = torch.randn(64, 300) * 3
    k = torch.randint(1, 300, (64,))
    p = torch.rand(64) * 0.9 + 0.05
    ours = processed_logits(logits, torch.ones(64), k, p, torch.zeros(64))
    theirs = apply_top_k_top_p_pytorch(logits.clone(), k, p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.allclose(ours.log_softmax(-1).nan_to_num(neginf=0), theirs.log_softmax(-1).nan_to_num(neginf=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selected_log_softmax_is_the_gathered_log_softmax(dtype: torch.dtype) -> None:
    from trainer.logprobs import selected_log_softmax

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 300, generator=gen) * 4).to(dtype).requires_grad_()
    ids = torch.randint(0, 300, (7,), generator=gen)
    naive = torch.log_softmax(logits.float(), dim=-1)[torch.arange(7), ids]
    ours = selected_log_softmax(logits, ids)
    tol = {"atol": 1e-5, "rtol": 0.0} if dtype == torch.float32 else {"atol": 0.0, "rtol": 1e-2}  # bf16: 8 bits
    assert ours.dtype == dtype and torch.allclose(ours.float(), naive, **tol)
    ours.sum().backward()  # differentiable in both branches
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def _reference_removed(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """vLLM's order written out plainly: min-p on probabilities, then top-k and top-p on an ascending sort."""
    vocab = logits.shape[1]
    work = logits.clone()
    probs = work.softmax(dim=-1)
    work.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1), float("-inf"))
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    ordered, index = work.sort(dim=-1)
    ordered.masked_fill_(ordered < ordered.gather(1, (vocab - k).unsqueeze(1)), float("-inf"))
    drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - p).unsqueeze(1)
    drop[:, -1] = False
    # Rows without top-p keep what top-k left (vLLM would drop zero-probability tokens there too).
    ordered = torch.where((p < 1.0).unsqueeze(1) & drop, torch.full_like(ordered, float("-inf")), ordered)
    return torch.isinf(work.scatter(1, index, ordered))


@pytest.mark.parametrize("mix", ["all", "top_k_only", "top_p_with_k", "min_p_only"])
def test_one_threshold_per_row_matches_the_sort_and_scatter(mix: str) -> None:
    gen = torch.Generator().manual_seed(7)
    n, vocab = 96, 500
    logits = torch.randn(n, vocab, generator=gen) * 3
    k = torch.randint(-1, 120, (n,), generator=gen)
    p = torch.where(torch.rand(n, generator=gen) < 0.3, torch.ones(n), torch.rand(n, generator=gen) * 0.9 + 0.05)
    min_p = torch.where(torch.rand(n, generator=gen) < 0.5, torch.zeros(n), torch.rand(n, generator=gen) * 0.1)
    if mix == "top_k_only":  # the partial sort (topk) path
        p, min_p = torch.ones(n), torch.zeros(n)
    elif mix == "top_p_with_k":  # top-p within the top k: partial sort too
        k, min_p = torch.randint(1, 200, (n,), generator=gen), torch.zeros(n)
    elif mix == "min_p_only":
        k, p = torch.zeros(n, dtype=torch.long), torch.ones(n)
    ours = torch.isinf(processed_logits(logits, torch.ones(n), k, p, min_p))
    assert ours.any() and not ours.all(dim=1).any()
    assert torch.equal(ours, _reference_removed(logits, k, p, min_p))


def test_neutral_sampling_is_a_pass_through() -> None:
    logits = torch.randn(3, 10)
    out = processed_logits(logits, torch.ones(3), torch.zeros(3, dtype=torch.long), torch.ones(3), torch.zeros(3))
    assert out is logits  # no copy, no mask: T = 1, top-k/top-p/min-p off
