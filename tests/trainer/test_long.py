"""Long trajectories: the chunked LM head and packed rows give what the plain forward pass gives."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tests.trainer.helpers import make_trajectory, random_tokens
from trainer.batch import Batch, Example, collate, recorded_behaviour
from trainer.logprobs import head_logprobs, packable, sequence_logprobs, split_head
from trainer.objective import tis_loss
from trainer.policy import Policy, TrainConfig, load_policy

SAMPLINGS: list[dict[str, Any]] = [
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.0},
    {"temperature": 1.3, "top_k": 40},
    {"temperature": 0.8, "top_p": 0.95, "top_k": 100, "min_p": 0.02},
]


@pytest.fixture(scope="module")
def policy() -> Policy:
    policy = load_policy(TrainConfig(model="tiny", threads=1, lr=0.0))
    torch.manual_seed(1)
    for name, p in policy.model.named_parameters():
        if "lora_B" in name:  # zero at init: give LoRA A a gradient too
            torch.nn.init.normal_(p, std=0.05)
    return policy


def _batch(policy: Policy, lengths: list[int], *, pack: bool = False) -> Batch:
    rng = random.Random(sum(lengths))
    vocab = int(policy.model.config.vocab_size)
    examples = []
    for i, n in enumerate(lengths):
        prompt = n // 2
        t = make_trajectory(
            f"t{i}",
            random_tokens(rng, prompt, vocab),
            random_tokens(rng, n - prompt, vocab),
            logprobs=[-rng.uniform(0.5, 3.0) for _ in range(n - prompt)],
            sampling=SAMPLINGS[i % len(SAMPLINGS)],
        )
        examples.append(Example(t, 1.0 if i % 2 else -0.5, recorded_behaviour(t)))
    return collate(examples, policy.pad_id, policy.device, pack=pack)


def _step(policy: Policy, b: Batch, **kw: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs, TIS loss and the LoRA gradients of one forward/backward pass."""
    policy.model.zero_grad(set_to_none=True)
    logp = sequence_logprobs(
        policy.model, b.input_ids, b.attention_mask, b.mask > 0, b.temperature, b.top_k, b.top_p, b.min_p, **kw
    ).logprobs
    loss = tis_loss(logp, logp.detach(), b.behav, b.mask, b.adv, n_tokens=b.n_tokens)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), loss.detach(), grads


def _same(a: tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], b: Any) -> None:
    assert torch.allclose(a[0], b[0], atol=1e-5, rtol=0)
    assert torch.allclose(a[1], b[1], atol=1e-6, rtol=1e-5)
    assert a[2].keys() == b[2].keys() and len(a[2]) > 0
    for name in a[2]:
        assert torch.allclose(a[2][name], b[2][name], atol=1e-6, rtol=1e-4), name


def test_chunked_head_gives_the_unchunked_loss_and_gradients(policy: Policy) -> None:
    b = _batch(policy, [40, 33, 25, 12])
    vocab = int(policy.model.config.vocab_size)
    unchunked = _step(policy, b, chunk_elements=0)
    assert any(float(g.abs().max()) > 0 for name, g in unchunked[2].items() if "lora_A" in name)
    for positions in (1, 7, 10_000):  # every position its own chunk, a ragged last chunk, one chunk
        _same(unchunked, _step(policy, b, chunk_elements=positions * vocab))


def test_checkpointed_chunks_keep_no_logits_for_backward(policy: Policy) -> None:
    parts = split_head(policy.model)
    assert parts is not None
    head = parts[1]
    n, vocab = 50, head.out_features
    states = torch.randn(n, head.in_features, requires_grad=True)
    ids = torch.randint(0, vocab, (n,))
    params = (torch.full((n,), 0.7), torch.full((n,), 40), torch.full((n,), 0.9), torch.zeros(n))

    def largest_saved(chunk_elements: int) -> tuple[int, torch.Tensor]:
        saved: list[int] = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() != head.weight.data_ptr():  # the head's own weight is saved either way
                saved.append(t.numel())
            return t

        states.grad = None
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            out = head_logprobs(head, states, ids, *params, chunk_elements=chunk_elements)
        out.sum().backward()
        assert states.grad is not None
        return max(saved), states.grad.clone()

    whole, grad_whole = largest_saved(n * vocab)
    chunked, grad_chunked = largest_saved(8 * vocab)
    assert whole >= n * vocab  # one chunk: the [50 × vocab] logits are kept for backward
    assert chunked <= 8 * vocab  # checkpointed: at most one chunk's (the last, 2 positions, here)
    assert torch.allclose(grad_whole, grad_chunked, atol=1e-6)


def test_packed_rows_give_the_padded_logprobs_loss_and_gradients(policy: Policy) -> None:
    assert packable(policy.model)
    lengths = [30, 12, 9, 17, 5]
    padded = _batch(policy, lengths)
    packed = _batch(policy, lengths, pack=True)
    assert packed.packed is not None and packed.packed.input_ids.shape == (3, 30)  # [30], [17, 12], [9, 5]
    assert torch.equal(packed.input_ids, padded.input_ids)
    _same(_step(policy, padded), _step(policy, packed, packed=packed.packed))
    # And through the chunked head with several chunks.
    vocab = int(policy.model.config.vocab_size)
    chunked = _step(policy, packed, packed=packed.packed, chunk_elements=5 * vocab)
    _same(_step(policy, padded, chunk_elements=0), chunked)


def test_packing_without_restarting_positions_would_differ(policy: Policy) -> None:
    # The test above can fail: the same packed rows read as one long sequence score differently.
    b = _batch(policy, [30, 12, 9, 17, 5], pack=True)
    assert b.packed is not None
    wrong = type(b.packed)(b.packed.input_ids, torch.arange(30).expand(3, 30), b.packed.row, b.packed.offset)
    right = _step(policy, b, packed=b.packed)[0]
    assert not torch.allclose(_step(policy, b, packed=wrong)[0], right, atol=1e-3)


def test_recomputed_chunks_reuse_their_thresholds(policy: Policy, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.logprobs as logprobs

    calls: list[int] = []
    real = logprobs._cutoff

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(logprobs, "_cutoff", counted)
    b = _batch(policy, [40, 33])
    n = int((b.mask[:, 1:] > 0).sum())
    vocab = int(policy.model.config.vocab_size)
    _step(policy, b, chunk_elements=4 * vocab)
    assert len(calls) == -(-n // 4)  # one sort per chunk, none again when backward recomputes them
