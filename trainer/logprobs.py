"""Per-token log-probabilities under the *processed* sampling distribution vLLM reports.

The engine runs with ``--logprobs-mode processed_logprobs``, so each recorded
behaviour logprob μ is ``log_softmax`` of the logits *after* the call's sampling
transforms. For the importance ratio π/μ to mean anything, the trainer must
score tokens under the very same transforms. vLLM 0.32's sampler
(``vllm/v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``) does, per row:

1. temperature: ``logits / T`` (greedy rows, T < 1e-5, are left unscaled and
   vLLM forces top-k/top-p/min-p off for them);
2. min-p (an argmax-invariant logits processor): drop tokens whose probability is
   below ``min_p × max probability``;
3. top-k: keep logits ≥ the k-th largest (ties kept); ``k ≤ 0`` or ``k ≥ V`` is off;
4. top-p: on the ascending sort of the top-k-filtered logits, drop tokens whose
   cumulative probability is ≤ ``1 − p``, always keeping the most likely one;
5. ``log_softmax`` in float32.

We mirror that here on plain tensors so it can be unit-tested without an engine.
One deliberate difference: the token we score is always kept in the support.
On-policy it is in the support anyway (it was sampled from it); off-policy, a
token outside the current nucleus would get log π = −∞ and a NaN gradient, so
we keep it with its temperature-scaled logit instead (its ratio is then small,
which is what truncation and rejection are for).

Penalties, ``logit_bias``, ``min_tokens`` and bad words also change vLLM's
processed distribution; we do not reproduce them, and :func:`unsupported`
names them so the caller can exclude such calls and count why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below this temperature a row is greedy

# Sampling fields that change vLLM's processed distribution and that we do not mirror,
# with the value that makes them neutral.
_NEUTRAL: dict[str, Any] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "min_tokens": 0,
    "bad_words": None,
    "allowed_token_ids": None,
}


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters that shape the processed distribution; defaults are vLLM's."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]) -> Sampling:
        """Read a recorded sampling dict; missing or null fields take vLLM's defaults."""

        def get(name: str, default: float) -> float:
            value = params.get(name)
            return default if value is None else float(value)

        temperature = get("temperature", 1.0)
        if temperature < SAMPLING_EPS:
            # vLLM's SamplingParams turns every filter off for greedy requests.
            return cls(temperature=0.0)
        return cls(
            temperature=temperature,
            top_p=get("top_p", 1.0),
            top_k=int(get("top_k", 0)),
            min_p=get("min_p", 0.0),
        )


def unsupported(params: Mapping[str, Any]) -> list[str]:
    """Names of recorded sampling fields that change the distribution in ways we do not mirror."""
    found = []
    for name, neutral in _NEUTRAL.items():
        value = params.get(name)
        if value is None or value == neutral or (neutral is None and not value):
            continue
        found.append(name)
    return found


def processed_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply vLLM's temperature, min-p, top-k and top-p to rows of logits ``[N, V]``.

    The per-row parameters are 1-D tensors of length N. Filter masks are computed
    on detached values, so gradients flow only through the kept logits. ``keep``
    (``[N]`` token ids) stays in the support whatever the filters say. Returns
    float32 logits with −∞ where a token is outside the support.
    """
    temp = torch.where(temperature < SAMPLING_EPS, torch.ones_like(temperature), temperature)
    scaled = logits.float() / temp.unsqueeze(1)
    remove = _filter_mask(scaled.detach(), top_k, top_p, min_p)
    if remove is None:
        return scaled
    if keep is not None:
        remove = remove.scatter(1, keep.unsqueeze(1), False)
    return scaled.masked_fill(remove, float("-inf"))


def _filter_mask(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor | None:
    """Boolean ``[N, V]`` mask of tokens vLLM removes, or None when no row filters."""
    vocab = logits.shape[1]
    use_min_p = bool((min_p > SAMPLING_EPS).any())
    k = torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k)
    use_k = bool((k < vocab).any())
    use_p = bool((top_p < 1.0).any())
    if not (use_min_p or use_k or use_p):
        return None
    work = logits.clone()
    if use_min_p:
        probs = work.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        work.masked_fill_(probs < threshold, float("-inf"))
    if use_k or use_p:
        ordered, index = work.sort(dim=-1, descending=False)
        if use_k:
            kth = ordered.gather(1, (vocab - k.long()).unsqueeze(1))
            ordered.masked_fill_(ordered < kth, float("-inf"))
        if use_p:
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= (1 - top_p).unsqueeze(1)
            drop[:, -1] = False  # vLLM always keeps the most likely token
            ordered.masked_fill_(drop, float("-inf"))
        work = work.scatter(1, index, ordered)
    return torch.isinf(work) & (work < 0)


def token_logprobs(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Log-probability of ``ids[n]`` under row n's processed distribution; logits ``[N, V]``.

    The scored token is kept in the support even when a filter would drop it (see
    the module docstring), so the result is always finite.
    """
    processed = processed_logits(logits, temperature, top_k, top_p, min_p, keep=ids)
    return selected_log_softmax(processed, ids)


def selected_log_softmax(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[n, ids[n]]`` for ``[N, V]`` logits, the same arithmetic on every device.

    Single-precision and wider: the picked logit minus the row's logsumexp (no [N, V] log-softmax
    is kept for backward). Half precision: logsumexp loses too much there, so a real log-softmax.
    Our own rather than TRL's: importing trl pulls datasets and pandas into every training run,
    and on GPUs TRL switches to a fused Triton kernel whose rounding differs from what we tested.
    """
    index = ids.unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        return logits.gather(-1, index).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, index).squeeze(-1)


@dataclass
class Scored:
    """What one forward pass over a padded batch yields for the positions that matter."""

    logprobs: torch.Tensor  # [B, T] float32; 0 where ``positions`` is False
    positions: torch.Tensor  # [B, T] bool: tokens that were scored (sampled tokens, t ≥ 1)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> Scored:
    """Score every token where ``score_mask`` is set, under that token's sampling parameters.

    All tensors are ``[B, T]`` (right-padded). The token at t is predicted by the
    logits at t − 1, so position 0 is never scored. Only the needed columns go
    through the LM head (``logits_to_keep``): with long prompts or tool outputs
    most of a trajectory is context, and the vocabulary projection is the
    largest tensor in the step.
    """
    positions = score_mask.bool().clone()
    positions[:, 0] = False
    columns = torch.nonzero(positions.any(dim=0)).squeeze(1)  # token positions t with work to do
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if columns.numel() == 0:
        return Scored(out, positions)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=columns - 1).logits
    rows, cols = torch.nonzero(positions[:, columns], as_tuple=True)  # index into [B, len(columns)]
    t = columns[cols]
    scored = token_logprobs(
        logits[rows, cols], input_ids[rows, t],
        temperature[rows, t], top_k[rows, t], top_p[rows, t], min_p[rows, t],
    )  # fmt: skip
    out = out.index_put((rows, t), scored)
    return Scored(out, positions)


def finite(value: float | None) -> bool:
    """True for a usable recorded logprob (not None, NaN or ±∞)."""
    return value is not None and math.isfinite(value)
