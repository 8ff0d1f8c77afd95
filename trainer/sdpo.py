"""Learning from text: self-distillation (SDPO, arXiv 2601.20802) and filtered SFT on corrections.

A logged completion y of context x got textual feedback f (a comment, a
correction, the next user turn). The *teacher* is the serving version shown f,
π_T(· | x, f), with no gradient; the *student* is the policy being trained,
without it, π_θ(· | x). Where the teacher, knowing what went wrong, finds a logged token
more likely than the student does, that token is reinforced; where less
likely, it is discouraged. That turns one sentence into a per-token signal,
without a reward model and without re-running the harness: both contexts are
built from stored records only.

Two forms, both over right-padded ``[B, T]`` tensors like :mod:`trainer.objective`
(``mask`` 1 on logged sampled tokens; sums divided by ``n_tokens``, the step's
trained-token count):

* :func:`sdpo_token_loss`: the sampled-token estimator. Per logged token the
  advantage is sg(log π_T(y_t) − log π_S(y_t)) and the loss is
  −(1/N) Σ m · w · adv · log π_S(y_t). It needs only the teacher's log-prob of
  the logged tokens (one extra no-grad forward pass).
* :func:`sdpo_topk_loss`: the logit-level form, per position the reverse KL
  KL(π_S ‖ sg π_T) over the student's top-k tokens plus one tail bucket holding
  the rest of the mass (as in SDPO: the full vocabulary is too large to keep
  for both models at every position).

Both are weighted per token by w = sg(min(π_prox/μ, C)), the truncated
behaviour ratio of TIS: the logged y was sampled by an older adapter μ, not by
the student. A teacher equal to the student gives exactly zero gradient.

What keeps it from collapsing (docs/architecture.md, "Objectives"): the teacher is
a frozen snapshot of the serving version, never the weights being stepped
(:mod:`trainer.teacher`); the per-token log-ratio is clipped to ±``signal_clip``
(one token the teacher finds 1000× likelier must not outweigh a sentence); and
:func:`kl_to_reference` holds the student near the serving version, so repeated
steps on the same few comments cannot walk it off into degenerate replies.

Corrections also train directly: :func:`correction_loss` is behaviour cloning
of the corrected text placed as the assistant turn under the student's own
context x (filtered by :func:`correction_exclusion`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainer.objective import token_ratio

# The teacher's extra turn. Kept in one place: changing it changes what every SDPO
# example teaches, so it is part of the objective, not of the caller.
HINT_TEMPLATE = "Feedback on an earlier answer of yours to this:\n{feedback}\n\nTaking that into account, answer again."

# Reasons a correction is not trained on (counted like every exclusion).
CORRECTION_EMPTY = "correction_empty"
CORRECTION_SAME = "correction_same_as_answer"
CORRECTION_TOO_LONG = "correction_too_long"

TAIL_CLAMP = -1e-7  # log of the top-k mass is clamped below 0 so the tail's log stays finite


# --------------------------------------------------------------------------- contexts from stored records


def teacher_messages(messages: Sequence[dict[str, Any]], feedback: str) -> list[dict[str, Any]]:
    """The teacher's prompt: the completion's engine-facing request messages, then the feedback as a hint.

    Template (the assistant turn being scored comes right after it)::

        <the request's messages, unchanged: system, user, assistant, tool, ...>
        {"role": "user", "content": HINT_TEMPLATE.format(feedback=feedback)}
        <assistant: the logged completion y, scored token by token>

    The hint is one extra user turn rather than an edit of the last message, so
    the student's context is a strict prefix of the teacher's and tool results or
    multi-part contents are never rewritten. The caller renders these messages
    with the chat template's generation prompt and appends the *logged* token ids
    of y (never re-tokenized text): see :func:`teacher_sequence`.
    """
    text = feedback.strip()
    if not text:
        raise ValueError("feedback is empty: a teacher needs something to be shown")
    return [dict(m) for m in messages] + [{"role": "user", "content": HINT_TEMPLATE.format(feedback=text)}]


def correction_messages(messages: Sequence[dict[str, Any]], correction: str) -> list[dict[str, Any]]:
    """The student's context followed by the corrected answer as the assistant turn (the SFT target)."""
    return [dict(m) for m in messages] + [{"role": "assistant", "content": correction.strip()}]


def teacher_sequence(teacher_prompt_ids: Sequence[int], sampled_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """Token ids and mask of the teacher's pass: its rendered prompt, then the logged sampled ids (mask 1).

    Aligning teacher and student is then a matter of taking the last ``len(sampled_ids)``
    masked positions of each: see :func:`align`.
    """
    ids = list(teacher_prompt_ids) + list(sampled_ids)
    mask = [0] * len(teacher_prompt_ids) + [1] * len(sampled_ids)
    return ids, mask


def align(values: torch.Tensor, mask: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Move per-token ``values`` ``[B, T1]`` at ``mask`` to the positions of ``target_mask`` ``[B, T2]``.

    Row by row, the k-th masked value of ``values`` lands on the k-th masked position of
    ``target_mask`` (both masks must count the same tokens per row); elsewhere 0.
    Used to lay the teacher's log-probs, computed on its longer context, over the
    student's sequence.
    """
    src = mask.bool()
    dst = target_mask.bool()
    if not torch.equal(src.sum(dim=1), dst.sum(dim=1)):
        raise ValueError("teacher and student masks select different numbers of tokens")
    out = torch.zeros(target_mask.shape, dtype=values.dtype, device=values.device)
    out[dst] = values[src]
    return out


# --------------------------------------------------------------------------- losses


def behaviour_weight(prox: torch.Tensor, behav: torch.Tensor, clip: float) -> torch.Tensor:
    """sg(min(π_prox/μ, C)) per token, exactly TIS's weight (1 where μ is unknown)."""
    return token_ratio(prox, behav).clamp(max=clip).detach()


def token_signal(student_logp: torch.Tensor, teacher_logp: torch.Tensor, clip: float = 0.0) -> torch.Tensor:
    """sg(clamp(log π_T(y_t) − log π_S(y_t), ±clip)): positive where the teacher, shown the feedback, prefers y_t.

    ``clip`` 0 leaves the ratio unclipped. Clipped, a token the teacher finds vastly likelier
    or unlikelier (a tokenisation quirk, a hint that names the answer) pushes no harder than
    one it finds e^clip times so.
    """
    signal = (teacher_logp - student_logp).detach()
    return signal.clamp(-clip, clip) if clip > 0 else signal


def kl_to_reference(
    logp: torch.Tensor, ref_logp: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, n_tokens: int
) -> torch.Tensor:
    """(1/N) Σ m · w · k3, k3 = r − 1 − log r with r = π_ref(y_t)/π_S(y_t): KL(π_S ‖ π_ref) from logged tokens.

    ``ref_logp`` is the serving version's log-prob of the logged tokens under the student's
    context (no gradient). The logged tokens were sampled near the serving version, so the
    k3 estimator (≥ 0, exact 0 where the student equals it) is low-variance; its gradient
    1 − π_ref/π_S pulls each token's probability back towards the reference's.
    """
    log_r = (ref_logp.detach() - logp).clamp(-20.0, 20.0)
    k3 = torch.exp(log_r) - 1 - log_r
    return (weight * mask * k3).sum() / max(n_tokens, 1)


def sdpo_token_loss(
    logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    prox: torch.Tensor,
    behav: torch.Tensor,
    mask: torch.Tensor,
    n_tokens: int,
    clip: float = 2.0,
    center: bool = False,
    signal_clip: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl: float = 0.0,
) -> torch.Tensor:
    """−(1/N) Σ m · w · clamp(log π_T − log π_S, ±c) · log π_S, plus ``kl`` · KL(π_S ‖ π_ref), on the logged tokens.

    ``logp`` is the student's log π_θ(y_t | x) (with gradient), ``teacher_logp`` the teacher's
    log-prob of y_t given (x, f) aligned to the same positions (detached here whatever the caller
    passed). ``center``: subtract the signal's mean over the masked tokens first, a baseline: a
    teacher that finds *every* logged token less likely (shown any feedback at all) then pushes
    none of them down. ``signal_clip`` c: see :func:`token_signal`. ``ref_logp`` (with ``kl`` > 0):
    the serving version's log-probs of the same tokens, see :func:`kl_to_reference`.
    """
    weight = behaviour_weight(prox, behav, clip)
    adv = token_signal(logp, teacher_logp, signal_clip)
    if center:
        adv = adv - (adv * mask).sum() / mask.sum().clamp(min=1)
    loss = -(weight * mask * adv * logp).sum() / max(n_tokens, 1)
    if kl > 0 and ref_logp is not None:
        loss = loss + kl * kl_to_reference(logp, ref_logp, weight, mask, n_tokens)
    return loss


def with_tail(topk_logp: torch.Tensor) -> torch.Tensor:
    """Append log(1 − Σ p) to top-k log-probs ``[..., k]`` → ``[..., k + 1]``, a distribution again."""
    mass = torch.logsumexp(topk_logp, dim=-1, keepdim=True).clamp(max=TAIL_CLAMP)
    tail = torch.log(-torch.expm1(mass))
    return torch.cat([topk_logp, tail], dim=-1)


def topk_pair(student: torch.Tensor, teacher: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs ``[..., V]`` reduced to the student's top-k tokens plus a tail bucket.

    The indices are chosen on the student (detached), gathered from both, so the two
    ``[..., k + 1]`` distributions are over the same outcomes. ``k ≥ V`` keeps every token.
    """
    k = min(k, student.shape[-1])
    index = student.detach().topk(k, dim=-1).indices
    return with_tail(student.gather(-1, index)), with_tail(teacher.detach().gather(-1, index))


def sdpo_topk_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    prox: torch.Tensor,
    behav: torch.Tensor,
    mask: torch.Tensor,
    n_tokens: int,
    k: int = 20,
    clip: float = 2.0,
    signal_clip: float = 0.0,
) -> torch.Tensor:
    """(1/N) Σ m · sg(min(π_prox/μ, C)) · KL(π_S ‖ sg π_T) over top-k + tail, per position.

    ``student_logp`` and ``teacher_logp`` are full log-softmax rows ``[B, T, V]`` at the
    positions that predict each logged token (the teacher's aligned to the student's);
    ``prox``/``behav`` are the logged tokens' log π_prox and μ ``[B, T]`` for the weight.
    ``signal_clip`` c > 0: the teacher's log-prob of each bucket is held within ±c of the
    student's before the KL, the per-token log-ratio clip of :func:`token_signal` per bucket.
    """
    s, t = topk_pair(student_logp, teacher_logp, k)
    if signal_clip > 0:
        anchor = s.detach()
        t = torch.maximum(torch.minimum(t, anchor + signal_clip), anchor - signal_clip)
    kl = (s.exp() * (s - t)).sum(dim=-1)
    weight = behaviour_weight(prox, behav, clip)
    return (weight * mask * kl).sum() / max(n_tokens, 1)


def correction_loss(logp: torch.Tensor, mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """−(1/N) Σ m · log π_θ(correction tokens | the student's context): filtered SFT."""
    return -(mask * logp).sum() / max(n_tokens, 1)


def correction_exclusion(correction: str | None, logged_answer: str | None, max_chars: int = 8000) -> str | None:
    """Why a correction is not a training example, or None.

    A correction equal to what the model said (whitespace aside) teaches nothing SFT
    should add on top of the numeric grade; an empty or huge one is not an answer.
    """
    text = (correction or "").strip()
    if not text:
        return CORRECTION_EMPTY
    if len(text) > max_chars:
        return CORRECTION_TOO_LONG
    if logged_answer is not None and " ".join(text.split()) == " ".join(logged_answer.split()):
        return CORRECTION_SAME
    return None


def signal_mean(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of log π_T − log π_S over masked tokens: a step metric (> 0: the feedback made y likelier)."""
    n = float(mask.sum())
    return float(((teacher_logp - student_logp).detach() * mask).sum()) / n if n else 0.0
