"""Forward/backward passes for text-feedback examples: SDPO (teacher without gradient) and corrections.

Called inside a training step next to the scored (TIS) part: it accumulates
gradients as *sums* over tokens, and the step divides by the count of every
trained token (TIS, SDPO and correction together) before the optimiser step,
as :mod:`trainer.loop` does for TIS alone. The weights of the parts are flags
with defaults (``sdpo_weight``, ``correction_weight``).

The teacher is the serving version shown the feedback (:mod:`trainer.teacher`: a
frozen snapshot of the LoRA weights riding on the model, or a slow EMA of them):
one no-grad forward pass over its longer context, its log-probs of the logged
tokens moved onto the student's positions (:func:`trainer.sdpo.align`). With a
KL weight, one more no-grad pass scores the student's own context under the
serving version (skipped while the weights still equal it: the KL is then 0).
Both are scored under the call's recorded sampling parameters, the distribution
μ came from.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from trainer.batch import Batch, Example, collate, recorded_behaviour
from trainer.logprobs import processed_logits, sequence_logprobs
from trainer.sdpo import align, behaviour_weight, correction_loss, kl_to_reference, sdpo_token_loss, sdpo_topk_loss
from trainer.teacher import Teacher, attached
from trainer.textual import TextualExample

Form = Literal["token", "topk"]
FLOOR = -1e4  # log-probs of tokens outside a filtered support: finite, so 0 · (−∞) never makes a NaN


@dataclass
class TextualSums:
    """Per-part loss sums and token counts of one step (mergeable across ranks as a vector)."""

    sdpo_loss: float = 0.0
    sdpo_tokens: float = 0.0
    sdpo_signal: float = 0.0  # Σ (log π_T − log π_S) over SDPO tokens
    correction_loss: float = 0.0
    correction_tokens: float = 0.0
    sdpo_abs_signal: float = 0.0  # Σ |log π_T − log π_S| (before the clip)
    sdpo_clipped: float = 0.0  # tokens whose log-ratio the clip held
    sdpo_kl: float = 0.0  # Σ k3 estimate of KL(π_S ‖ serving) over SDPO tokens

    @property
    def tokens(self) -> float:
        return self.sdpo_tokens + self.correction_tokens

    def as_vector(self) -> list[float]:
        return list(asdict(self).values())

    def metrics(self) -> dict[str, Any]:
        """Step metrics: each part's mean loss and token count, and the teacher's mean preference."""
        return {
            "sdpo_loss": self.sdpo_loss / self.sdpo_tokens if self.sdpo_tokens else None,
            "sdpo_tokens": int(self.sdpo_tokens),
            "sdpo_signal_mean": self.sdpo_signal / self.sdpo_tokens if self.sdpo_tokens else None,
            "correction_loss": self.correction_loss / self.correction_tokens if self.correction_tokens else None,
            "correction_tokens": int(self.correction_tokens),
            "sdpo_abs_signal_mean": self.sdpo_abs_signal / self.sdpo_tokens if self.sdpo_tokens else None,
            "sdpo_clipped_frac": self.sdpo_clipped / self.sdpo_tokens if self.sdpo_tokens else None,
            "sdpo_kl_serving": self.sdpo_kl / self.sdpo_tokens if self.sdpo_tokens else None,
        }


def _score(model: Any, b: Batch) -> torch.Tensor:
    return sequence_logprobs(
        model, b.input_ids, b.attention_mask, b.mask > 0, b.temperature, b.top_k, b.top_p, b.min_p
    ).logprobs


def _rows(model: Any, b: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Processed log-softmax rows ``[N, V]`` predicting each masked token, and where they are (row, t).

    Rows come in row-major order of the masked positions, so a teacher and a student with the
    same number of masked tokens per row line up one to one. The top-k form needs them whole.
    """
    positions = (b.mask > 0).clone()
    positions[:, 0] = False
    columns = torch.nonzero(positions.any(dim=0)).squeeze(1)
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, logits_to_keep=columns - 1).logits
    rows, cols = torch.nonzero(positions[:, columns], as_tuple=True)
    t = columns[cols]
    processed = processed_logits(
        logits[rows, cols],
        b.temperature[rows, t],
        b.top_k[rows, t],
        b.top_p[rows, t],
        b.min_p[rows, t],
        keep=b.input_ids[rows, t],
    )
    return torch.log_softmax(processed, dim=-1).clamp(min=FLOOR), (rows, t)


def _chunks(examples: Sequence[TextualExample], max_tokens: int) -> list[list[TextualExample]]:
    """Longest first, at most ``max_tokens`` padded tokens of the longer sequence (the teacher's) per chunk."""

    def size(e: TextualExample) -> int:
        return max(len(e.student.token_ids), len(e.teacher.token_ids) if e.teacher else 0)

    out: list[list[TextualExample]] = []
    for e in sorted(examples, key=lambda e: -size(e)):
        if out and (len(out[-1]) + 1) * size(out[-1][0]) <= max_tokens:
            out[-1].append(e)
        else:
            out.append([e])
    return out


def textual_backward(
    model: Any,
    pad_id: int,
    device: torch.device | str,
    examples: Sequence[TextualExample],
    *,
    micro_tokens: int = 4096,
    clip: float = 2.0,
    sdpo_weight: float = 1.0,
    correction_weight: float = 1.0,
    form: Form = "token",
    k: int = 20,
    center: bool = False,
    teacher: Teacher | None = None,
) -> TextualSums:
    """Accumulate the summed SDPO and correction gradients of ``examples`` into ``model``'s parameters.

    ``form``: ``token`` (the sampled-token signal, one log-prob per position) or ``topk`` (reverse
    KL over the student's top ``k`` tokens plus a tail bucket, whole rows kept for both passes).
    ``teacher``: the serving snapshot, its clip and KL weight (default: the one riding on ``model``;
    none: the live model teaches, unclipped, without KL). Called once per step: an ``ema``
    teacher moves towards the current weights first.
    """
    teacher = teacher or attached(model)
    sums = TextualSums()
    sdpo = [e for e in examples if e.objective == "sdpo" and e.teacher is not None]
    sft = [e for e in examples if e.objective == "correction"]
    if teacher is not None and sdpo:
        teacher.update(model)
    signal_clip = teacher.signal_clip if teacher is not None else 0.0
    kl = teacher.kl if teacher is not None and teacher.moved(model) else 0.0  # unmoved: KL and its gradient are 0
    for chunk in _chunks(sdpo, micro_tokens):
        teachers = collate(
            [Example(e.teacher, 0.0, [math.nan] * len(e.teacher.token_ids)) for e in chunk if e.teacher], pad_id, device
        )
        b = collate([Example(e.student, 0.0, recorded_behaviour(e.student)) for e in chunk], pad_id, device)
        ref = None
        if kl > 0 and teacher is not None:
            with torch.no_grad(), teacher.swapped(model):
                ref = _score(model, b)
        if form == "topk":
            loss, logp, aligned = _topk(model, teachers, b, k, clip, teacher, signal_clip)
            if ref is not None:
                weight = behaviour_weight(logp.detach(), b.behav, clip)
                loss = loss + kl * kl_to_reference(logp, ref, weight, b.mask, n_tokens=1)
            logp = logp.detach()
        else:
            with torch.no_grad(), _teaching(teacher, model):
                teacher_logp = _score(model, teachers)
            logp = _score(model, b)
            aligned = align(teacher_logp, teachers.mask, b.mask)
            loss = sdpo_token_loss(
                logp,
                aligned,
                logp.detach(),
                b.behav,
                b.mask,
                n_tokens=1,
                clip=clip,
                center=center,
                signal_clip=signal_clip,
                ref_logp=ref,
                kl=kl,
            )
            logp = logp.detach()
        (sdpo_weight * loss).backward()
        diff = (aligned - logp) * b.mask
        sums.sdpo_loss += float(loss.detach())
        sums.sdpo_tokens += float(b.mask.sum())
        sums.sdpo_signal += float(diff.sum())
        sums.sdpo_abs_signal += float(diff.abs().sum())
        sums.sdpo_clipped += float(((diff.abs() > signal_clip) & (b.mask > 0)).sum()) if signal_clip > 0 else 0.0
        if ref is not None:
            log_r = ((ref - logp) * b.mask).clamp(-20.0, 20.0)
            sums.sdpo_kl += float(((torch.exp(log_r) - 1 - log_r) * b.mask).sum())
    for chunk in _chunks(sft, micro_tokens):
        b = collate([Example(e.student, 1.0, [math.nan] * len(e.student.token_ids)) for e in chunk], pad_id, device)
        loss = correction_loss(_score(model, b), b.mask, n_tokens=1)
        (correction_weight * loss).backward()
        sums.correction_loss += float(loss.detach())
        sums.correction_tokens += float(b.mask.sum())
    return sums


def _teaching(teacher: Teacher | None, model: Any) -> Any:
    return teacher.teaching(model) if teacher is not None else contextlib.nullcontext()


def _topk(
    model: Any, teachers: Batch, b: Batch, k: int, clip: float, teacher: Teacher | None, signal_clip: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-k + tail reverse KL of one chunk; the student's logged-token log-probs (with gradient), the teacher's."""
    with torch.no_grad(), _teaching(teacher, model):
        teacher_rows, _ = _rows(model, teachers)
    student_rows, (rows, t) = _rows(model, b)
    ids = b.input_ids[rows, t].unsqueeze(1)
    picked = student_rows.gather(1, ids).squeeze(1)
    mu = b.behav[rows, t]
    loss = sdpo_topk_loss(
        student_rows.unsqueeze(0),
        teacher_rows.unsqueeze(0),
        picked.detach().unsqueeze(0),
        mu.unsqueeze(0),
        torch.ones_like(mu).unsqueeze(0),
        n_tokens=1,
        k=k,
        clip=clip,
        signal_clip=signal_clip,
    )
    logp = torch.zeros_like(b.mask).index_put((rows, t), picked)
    aligned = torch.zeros_like(b.mask).index_put((rows, t), teacher_rows.gather(1, ids).squeeze(1))
    return loss, logp, aligned
