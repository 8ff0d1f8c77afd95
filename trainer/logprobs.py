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
from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below this temperature a row is greedy
# How many [positions × vocab] logits the LM-head stage holds at once (float32: 64 MiB; the
# filters need a few such tensors): 341 positions of SmolLM2's 49k vocabulary, 110 of a 152k one.
CHUNK_ELEMENTS = 1 << 24

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
    memo: list[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """Apply vLLM's temperature, min-p, top-k and top-p to rows of logits ``[N, V]``.

    The per-row parameters are 1-D tensors of length N. Filter masks are computed
    on detached values, so gradients flow only through the kept logits. ``keep``
    (``[N]`` token ids) stays in the support whatever the filters say. Returns
    float32 logits with −∞ where a token is outside the support.

    Neutral settings cost nothing: T = 1 (or greedy) skips the division, and with
    min-p, top-k and top-p all off no mask is built. ``memo``: an empty list gets the
    rows' thresholds, a filled one supplies them (a recomputation for backward then
    skips the sort).
    """
    scaled = logits.float()
    unscaled = (temperature < SAMPLING_EPS) | (temperature == 1.0)
    if not bool(unscaled.all()):
        temp = torch.where(unscaled, torch.ones_like(temperature), temperature)
        scaled = scaled / temp.to(scaled.dtype).unsqueeze(1)
    if memo:
        cutoff = memo[0]
    else:
        cutoff = _cutoff(scaled.detach(), top_k, top_p, min_p)
        if memo is not None:
            memo.append(cutoff)
    if cutoff is None:
        return scaled
    remove = scaled.detach() < cutoff
    if keep is not None:
        remove = remove.scatter(1, keep.unsqueeze(1), False)
    return scaled.masked_fill(remove, float("-inf"))


def _cutoff(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor | None:
    """Per row, the smallest logit vLLM keeps (``[N, 1]``, −∞: everything), or None when no row filters.

    Every filter keeps the tokens at or above a value, so one threshold per row describes
    them all and the mask is a single comparison (no scatter back from sorted order):

    * min-p: p < min_p · p_max is logit < max logit + log(min_p), no softmax needed;
    * top-k: the k-th largest logit (ties kept, as vLLM does);
    * top-p: vLLM's ascending cumulative sum over the min-p/top-k survivors, from one
      descending sort per row; the tokens it drops are a prefix of the ascending order, so
      their count gives the threshold. When every top-p row also has a top-k, a partial
      sort (``topk``) of the largest k replaces the full one. Ties at the nucleus edge are
      all kept, where vLLM's positional mask may split them (not seen with real logits).
    """
    n, vocab = logits.shape
    k = torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k).long()
    rows_k, rows_p = k < vocab, top_p < 1.0
    use_min_p = bool((min_p > SAMPLING_EPS).any())
    use_k, use_p = bool(rows_k.any()), bool(rows_p.any())
    if not (use_min_p or use_k or use_p):
        return None
    cutoff = torch.full((n, 1), float("-inf"), dtype=logits.dtype, device=logits.device)
    if use_min_p:
        floor = torch.log(min_p.to(logits.dtype).clamp(min=0)).unsqueeze(1)  # log 0 = −∞: the row keeps all
        cutoff = logits.amax(dim=-1, keepdim=True) + floor
    if not (use_k or use_p):
        return cutoff
    partial = use_k and not bool((rows_p & ~rows_k).any())
    width = int(k[rows_k].max()) if partial else vocab
    if width < vocab:
        values = logits.topk(width, dim=-1).values  # descending
    else:
        values = logits.sort(dim=-1, descending=True).values
    if use_k:
        kth = values.gather(1, (k.clamp(max=width) - 1).unsqueeze(1))
        cutoff = torch.where(rows_k.unsqueeze(1), torch.maximum(cutoff, kth), cutoff)
    if use_p:
        # One [N, width] temporary at a time beside the sorted values (the vocabulary can be 150k wide).
        ascending = values.masked_fill(values < cutoff, float("-inf")).softmax(dim=-1).flip(-1).cumsum_(dim=-1)
        drop = ascending <= (1 - top_p).to(logits.dtype).unsqueeze(1)
        del ascending
        drop[:, -1] = False  # vLLM always keeps the most likely token
        smallest_kept = values.gather(1, (width - 1 - drop.sum(dim=-1)).unsqueeze(1))
        cutoff = torch.where(rows_p.unsqueeze(1), torch.maximum(cutoff, smallest_kept), cutoff)
    return cutoff


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


@dataclass(frozen=True)
class Packed:
    """Where each ``[B, T]`` row of a batch sits when several share one row of the forward pass."""

    input_ids: torch.Tensor  # [R, L], R ≤ B
    position_ids: torch.Tensor  # [R, L], restarting at 0 with every example (and with the row's padding)
    row: torch.Tensor  # [B]: the packed row holding example b
    offset: torch.Tensor  # [B]: where example b starts in it


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    *,
    packed: Packed | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Scored:
    """Score every token where ``score_mask`` is set, under that token's sampling parameters.

    All tensors are ``[B, T]`` (right-padded). The token at t is predicted by the
    hidden state at t − 1, so position 0 is never scored. Only those positions go
    through the LM head, ``chunk_elements // vocab`` of them at a time
    (:func:`head_logprobs`), so the head's ``[positions × vocab]`` logits never exist
    whole however long the trajectory. ``packed``: run the decoder on the packed rows
    instead (same log-probs, less padding). ``chunk_elements=0``, or a model whose head
    is not a plain projection of the last hidden state, takes the unchunked path: the
    model's own head over the needed columns (``logits_to_keep``).
    """
    positions = score_mask.bool().clone()
    positions[:, 0] = False
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    rows, t = torch.nonzero(positions, as_tuple=True)
    if rows.numel() == 0:
        return Scored(out, positions)
    parts = split_head(model) if chunk_elements > 0 else None
    if parts is None:
        scored = _unchunked(model, input_ids, attention_mask, positions, temperature, top_k, top_p, min_p)
        return Scored(out.index_put((rows, t), scored), positions)
    decoder, head = parts
    if packed is None:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        states = hidden[rows, t - 1]
    else:
        # No attention mask: transformers reads the segments off the restarting position ids.
        ids, position_ids = packed.input_ids, packed.position_ids
        hidden = decoder(input_ids=ids, position_ids=position_ids, use_cache=False).last_hidden_state
        states = hidden[packed.row[rows], packed.offset[rows] + t - 1]
    scored = head_logprobs(
        head,
        states,
        input_ids[rows, t],
        temperature[rows, t],
        top_k[rows, t],
        top_p[rows, t],
        min_p[rows, t],
        chunk_elements=chunk_elements,
    )
    return Scored(out.index_put((rows, t), scored), positions)


def _unchunked(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """The scored positions' log-probs from the model's own ``[B, columns, V]`` logits, in row-major order."""
    columns = torch.nonzero(positions.any(dim=0)).squeeze(1)  # token positions t with work to do
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=columns - 1).logits
    rows, cols = torch.nonzero(positions[:, columns], as_tuple=True)  # index into [B, len(columns)]
    t = columns[cols]
    return token_logprobs(
        logits[rows, cols],
        input_ids[rows, t],
        temperature[rows, t],
        top_k[rows, t],
        top_p[rows, t],
        min_p[rows, t],
    )


# Config fields of models whose logits are more than ``lm_head(last hidden state)``.
_HEAD_EXTRAS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def split_head(model: torch.nn.Module) -> tuple[Any, Any] | None:
    """The decoder (ids → last hidden state) and the LM head of a causal LM (PEFT-wrapped or not).

    None when the model has no such split or its logits are rescaled or capped after the
    head: those are scored by the model's own forward.
    """
    get_base = getattr(model, "get_base_model", None)
    base: Any = get_base() if callable(get_base) else model
    if not (callable(getattr(base, "get_decoder", None)) and callable(getattr(base, "get_output_embeddings", None))):
        return None
    config = getattr(base, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _HEAD_EXTRAS):
        return None
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    if decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


# Attention implementations that read packed segments off restarting position ids (transformers' masking_utils).
_PACKABLE = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


def packable(model: torch.nn.Module) -> bool:
    """Whether :func:`sequence_logprobs` can run ``model`` on packed rows (``Batch.packed``)."""
    parts = split_head(model)
    return parts is not None and getattr(parts[0].config, "_attn_implementation", None) in _PACKABLE


def head_logprobs(
    head: torch.nn.Linear,
    states: torch.Tensor,
    ids: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """:func:`token_logprobs` of ``head(states)`` for ``states`` ``[N, H]``, a chunk of positions at a time.

    Each chunk's logits, filters and log-softmax live only while the chunk is computed:
    with gradients, every chunk but the last is checkpointed (nothing of it kept for
    backward but its input; it is recomputed there, one chunk at a time), so the stage's
    peak memory is a chunk's, independent of N. One chunk: no recomputation at all.
    """
    vocab = head.out_features
    size = max(1, chunk_elements // vocab)
    n = states.shape[0]
    keep = torch.is_grad_enabled() and (states.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for start in range(0, n, size):
        args = [x[start : start + size] for x in (states, ids, temperature, top_k, top_p, min_p)]
        if keep and start + size < n:
            # The recomputation reuses the forward's thresholds through the memo: no second sort.
            chunk = partial(_head_chunk, head, [])
            parts.append(checkpoint(chunk, *args, use_reentrant=False))
        else:
            parts.append(_head_chunk(head, None, *args))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _head_chunk(
    head: torch.nn.Linear,
    memo: list[torch.Tensor | None] | None,
    states: torch.Tensor,
    ids: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    processed = processed_logits(head(states), temperature, top_k, top_p, min_p, keep=ids, memo=memo)
    return selected_log_softmax(processed, ids)


def finite(value: float | None) -> bool:
    """True for a usable recorded logprob (not None, NaN or ±∞)."""
    return value is not None and math.isfinite(value)
