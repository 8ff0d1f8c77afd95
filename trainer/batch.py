"""From :class:`storage.trajectories.Trajectory` to padded tensors, counting every exclusion.

Screening is where over-long or unusable trajectories leave the step, each with a
reason (agent-lightning's zero-row batches with no diagnostics are the failure
this avoids). Collation lays out what the objective needs per token: the ids,
which tokens are trained on, the recorded behaviour logprob μ (NaN when unknown)
and the sampling parameters of the call that produced the token.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from storage.grading import Exclusion, has_sampled_tokens
from storage.trajectories import Trajectory
from trainer.logprobs import Packed, Sampling, unsupported


@dataclass
class Example:
    """One trajectory ready for the loss: what to train on, with which advantage, against which μ."""

    trajectory: Trajectory
    advantage: float
    behaviour: list[float]  # μ aligned to token_ids; NaN where unknown or not trained on

    @property
    def length(self) -> int:
        return len(self.trajectory.token_ids)


@dataclass
class Batch:
    """Right-padded ``[B, T]`` tensors for one micro-batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor  # float: 1 on trained (sampled) tokens, position 0 never
    behav: torch.Tensor  # float32 μ, NaN where unknown
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    adv: torch.Tensor  # [B]
    packed: Packed | None = None  # the forward pass's layout when examples share rows

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


def screen(trajectories: Sequence[Trajectory], max_len: int) -> tuple[list[Trajectory], dict[str, str]]:
    """Keep trainable trajectories; return the others' ids mapped to the reason they were dropped."""
    kept: list[Trajectory] = []
    dropped: dict[str, str] = {}
    for t in trajectories:
        reason = _reason(t, max_len)
        if reason is None:
            kept.append(t)
        else:
            dropped[t.id] = reason
    return kept, dropped


def _reason(t: Trajectory, max_len: int) -> Exclusion | None:
    """Why the step drops ``t`` before any forward pass (storage screened it already; this holds for any input)."""
    if "eval" in t.tags:
        return Exclusion.EVAL
    if t.reward is None or not math.isfinite(t.reward):
        return Exclusion.UNGRADED
    if not (len(t.token_ids) == len(t.mask) == len(t.logprobs)):
        return Exclusion.MISALIGNED
    if t.token_ids and min(t.token_ids) < 0:
        return Exclusion.REDACTED  # ids masked by the proxy's redaction: not the sequence that was sampled
    if len(t.token_ids) > max_len:
        return Exclusion.TOO_LONG
    if not has_sampled_tokens(t.mask):
        return Exclusion.NO_SAMPLED_TOKENS
    if any(unsupported(turn.sampling) for turn in t.turns):
        return Exclusion.UNSUPPORTED_SAMPLING
    return None


def reasons(dropped: dict[str, str]) -> Counter[str]:
    """Exclusion counts by reason."""
    return Counter(dropped.values())


def missing_behaviour(t: Trajectory) -> bool:
    """True when some trained token has no usable recorded logprob."""
    return any(m and not _finite(lp) for m, lp in zip(t.mask[1:], t.logprobs[1:], strict=True))


def recorded_behaviour(t: Trajectory) -> list[float]:
    """μ per token as floats, NaN where the mask is 0 or the value is missing."""
    return [float(lp) if m and _finite(lp) else math.nan for m, lp in zip(t.mask, t.logprobs, strict=True)]  # type: ignore[arg-type]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def token_sampling(t: Trajectory) -> list[Sampling]:
    """The sampling parameters in force for each token (vLLM defaults outside every turn)."""
    out = [Sampling()] * len(t.token_ids)
    for turn in t.turns:
        params = Sampling.from_dict(turn.sampling)
        for i in range(max(turn.start, 0), min(turn.end, len(out))):
            out[i] = params
    return out


def trained_tokens(t: Trajectory) -> int:
    """How many tokens of ``t`` the loss sums over (sampled, and not the very first token)."""
    return sum(1 for m in t.mask[1:] if m)


def collate(
    examples: Sequence[Example], pad_id: int, device: torch.device | str = "cpu", *, pack: bool = False
) -> Batch:
    """Pad a micro-batch on the right; every per-token field is aligned with ``input_ids``.

    ``pack``: also lay the examples out several to a row for the forward pass (:func:`packing`);
    the per-token fields stay one example per row, as the objectives want them.
    """
    size = max(e.length for e in examples)
    b = len(examples)
    ids = torch.full((b, size), pad_id, dtype=torch.long)
    attn = torch.zeros((b, size), dtype=torch.long)
    mask = torch.zeros((b, size), dtype=torch.float32)
    behav = torch.full((b, size), math.nan, dtype=torch.float32)
    temperature = torch.ones((b, size), dtype=torch.float32)
    top_k = torch.zeros((b, size), dtype=torch.long)
    top_p = torch.ones((b, size), dtype=torch.float32)
    min_p = torch.zeros((b, size), dtype=torch.float32)
    for row, e in enumerate(examples):
        t = e.trajectory
        n = len(t.token_ids)
        ids[row, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        attn[row, :n] = 1
        mask[row, :n] = torch.tensor(t.mask, dtype=torch.float32)
        behav[row, :n] = torch.tensor(e.behaviour, dtype=torch.float32)
        params = token_sampling(t)
        temperature[row, :n] = torch.tensor([p.temperature for p in params])
        top_k[row, :n] = torch.tensor([p.top_k for p in params])
        top_p[row, :n] = torch.tensor([p.top_p for p in params])
        min_p[row, :n] = torch.tensor([p.min_p for p in params])
    mask[:, 0] = 0.0  # nothing predicts the first token
    behav = torch.where(mask > 0, behav, torch.full_like(behav, math.nan))
    adv = torch.tensor([e.advantage for e in examples], dtype=torch.float32)
    packed = packing(ids, [e.length for e in examples], pad_id) if pack else None
    if packed is not None:
        packed = Packed(*(x.to(device) for x in (packed.input_ids, packed.position_ids, packed.row, packed.offset)))
    fields = (ids, attn, mask, behav, temperature, top_k, top_p, min_p, adv)
    ids, attn, mask, behav, temperature, top_k, top_p, min_p, adv = (x.to(device) for x in fields)
    return Batch(ids, attn, mask, behav, temperature, top_k, top_p, min_p, adv, packed)


def pack_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """First-fit decreasing: the indices of ``lengths`` grouped into rows of at most ``width`` tokens."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fits = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if fits is None:
            rows.append([i])
            room.append(width - lengths[i])
        else:
            rows[fits].append(i)
            room[fits] -= lengths[i]
    return rows


def packing(ids: torch.Tensor, lengths: Sequence[int], pad_id: int) -> Packed | None:
    """Several examples to a row, each row as long as the longest example; None when none would share.

    Rows are no longer than the padded layout's, so attention (quadratic in the row's
    length, block-diagonal here) never costs more than padding did; what is saved is the
    padding's share of every other layer. Position ids restart at 0 with each example, and
    with the row's trailing padding, which transformers turns into a block-diagonal causal
    mask (and flash attention into variable-length sequences).
    """
    width = max(lengths)
    rows = pack_rows(lengths, width)
    if len(rows) == len(lengths):
        return None
    packed_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    row = torch.zeros(len(lengths), dtype=torch.long)
    offset = torch.zeros(len(lengths), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = lengths[i]
            packed_ids[r, at : at + n] = ids[i, :n]
            position_ids[r, at : at + n] = torch.arange(n)
            row[i], offset[i] = r, at
            at += n
        position_ids[r, at:] = torch.arange(width - at)  # the padding is a segment of its own
    return Packed(packed_ids, position_ids, row, offset)


def micro_batches(examples: Sequence[Example], max_tokens: int, *, pack: bool = False) -> Iterator[list[Example]]:
    """Group examples, longest first, so each micro-batch's forward pass holds at most ``max_tokens`` tokens.

    Padded rows count whole; with ``pack``, the rows :func:`pack_rows` would fill.
    """
    ordered = sorted(examples, key=lambda e: -e.length)
    current: list[Example] = []
    for e in ordered:
        width = current[0].length if current else e.length
        rows = len(pack_rows([x.length for x in (*current, e)], width)) if pack else len(current) + 1
        if current and rows * width > max_tokens:
            yield current
            current = []
        current.append(e)
    if current:
        yield current
