"""One optimisation step on graded trajectories: read it top to bottom.

The step is deliberately a single function. It screens the trajectories
(counting every exclusion), computes advantages, fills in missing behaviour
logprobs where the serving adapter is known, shards the examples over ranks,
runs forward/backward in micro-batches under each call's sampling parameters,
sums gradients over ranks, divides by the number of trained tokens and takes
one AdamW step (``ppo``: one per epoch).

With ``tis`` (and ``bc``, ``reinforce``) π_prox is the detached π_θ of the
very same forward pass: before the step they are equal, so a second no-grad
pass would only cost time. Sequence rejection needs π_prox and happens inside
that pass; that is why losses are summed unnormalised and the gradient is
divided by the global count of accepted tokens just before the optimiser step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from storage.grading import Exclusion
from storage.trajectories import Trajectory
from trainer import dist
from trainer.advantages import TaskBaseline, compute_advantages
from trainer.batch import (
    Batch,
    Example,
    collate,
    micro_batches,
    missing_behaviour,
    reasons,
    recorded_behaviour,
    screen,
)
from trainer.logprobs import packable, sequence_logprobs
from trainer.objective import (
    RatioStats,
    bc_loss,
    in_band,
    ppo_loss,
    reinforce_loss,
    sequence_ratio,
    tis_loss,
)
from trainer.policy import Policy, TrainConfig
from trainer.shard import gathered, lockstep
from trainer.textual import TextualExample
from trainer.textual_step import TextualSums, textual_backward

BELOW_THRESHOLD = "below_threshold"
OUT_OF_BAND = "ratio_out_of_band"
MISSING_MU_UNKNOWN_ADAPTER = "missing_logprobs_unknown_adapter"


@dataclass
class StepResult:
    """What one step did: metrics for the log and the database, and what it used up."""

    metrics: dict[str, Any]
    consumed: list[str]  # trajectory ids trained on or permanently excluded (never offered again)
    excluded: Counter[str]
    trained: bool  # False when nothing was left to train on (no optimiser step)


def train_step(
    policy: Policy,
    trajectories: Sequence[Trajectory],
    cfg: TrainConfig,
    baseline: TaskBaseline,
    adapters: Mapping[int, Path] | None = None,
    textual: Sequence[TextualExample] = (),
) -> StepResult:
    """Screen, weigh and train on ``trajectories``; every rank must call it with the same list.

    ``textual`` ("sdpo" only): self-distillation and correction examples trained in the same
    optimiser step, their tokens in the same denominator (:mod:`trainer.textual_step`).
    """
    obj = cfg.objective
    adapters = adapters or {}

    # 1. Screen: what cannot be trained on is counted by reason. Ungraded and eval
    #    trajectories stay available (a grade may still come); the rest is used up.
    kept, dropped = screen(trajectories, cfg.max_len)
    excluded = reasons(dropped)
    consumed = [t.id for t in trajectories if dropped.get(t.id) not in (Exclusion.UNGRADED, Exclusion.EVAL)]
    rewards = [float(t.reward) for t in kept if t.reward is not None]
    metrics: dict[str, Any] = {"reward_mean": sum(rewards) / len(rewards) if rewards else None}

    # 2. Advantages (bc: a filter instead), and what to do where μ is missing. A zero advantage
    #    (every attempt of a task scored alike) gives no gradient under tis, ppo or reinforce:
    #    such an example skips the forward/backward pass, but its tokens stay in the step's
    #    denominator, so the update equals the one computing it would give (but for sequence
    #    rejection, which could have dropped it from the count). It is used up like the rest.
    examples: list[Example] = []
    needs_mu: list[Example] = []
    recomputed = positive_only = idle = idle_tokens = 0
    if obj.name == "bc":
        for t in kept:
            if t.reward is not None and t.reward >= obj.bc_threshold:
                examples.append(Example(t, 1.0, [math.nan] * len(t.token_ids)))
            else:
                excluded[BELOW_THRESHOLD] += 1
    else:
        advantages = compute_advantages(
            [float(t.reward) for t in kept if t.reward is not None],
            [t.group for t in kept],
            [t.task_id for t in kept],
            baseline,
        )
        for t, a in zip(kept, advantages, strict=True):
            example = Example(t, a, recorded_behaviour(t))
            needs = missing_behaviour(t) and obj.name != "reinforce"
            known = needs and all(_known(policy, v, adapters) for v in t.adapters)
            if needs and not known and a <= 0:
                excluded[MISSING_MU_UNKNOWN_ADAPTER] += 1
                continue
            if a == 0.0:
                idle += 1
                idle_tokens += sum(t.mask[1:])  # collate's mask: nothing predicts the first token
                continue
            if known:
                needs_mu.append(example)
                recomputed += 1
            elif needs:
                positive_only += 1  # μ unknowable: only safe to reinforce, weight 1
            examples.append(example)
    metrics.update(
        recomputed_logprobs=recomputed,
        missing_logprobs_positive_only=positive_only,
        zero_advantage_trajectories=idle,
        zero_advantage_tokens=idle_tokens,
    )

    # 3. This rank's shard; μ recomputed with the adapter that served each turn.
    shard = examples[dist.rank() :: dist.world()]
    mine = {id(e) for e in shard}
    _fill_behaviour(policy, [e for e in needs_mu if id(e) in mine], adapters, cfg)

    # 4. Forward/backward and one optimiser step (ppo: one per epoch).
    text = TextualSums()
    if obj.name == "ppo":
        sums, rstats = _ppo_epochs(policy, shard, cfg, idle_tokens)
    else:
        text_shard = list(textual)[dist.rank() :: dist.world()] if obj.name == "sdpo" else []
        sums, rstats, text = _single_pass(policy, shard, cfg, idle_tokens, text_shard)
    text = TextualSums(*dist.sum_floats(text.as_vector()))
    loss_sum, tokens, rejected, trajs = dist.sum_floats(sums)
    totals = dist.sum_floats(rstats.as_vector())
    rstats.tokens, rstats.ratio_sum, rstats.ratio_sq_sum, rstats.clipped, rstats.kl_sum = totals
    rstats.ratio_max = dist.max_float(rstats.ratio_max)
    if rejected:
        excluded[OUT_OF_BAND] += int(rejected)
    trained = tokens > 0 or text.tokens > 0
    policy.dirty = policy.dirty or trained
    if obj.name == "sdpo":
        metrics.update(text.metrics())
    metrics.update(
        loss=loss_sum / (tokens + idle_tokens) if tokens > 0 else None,
        tokens=int(tokens),
        trajectories=int(trajs) + idle if trained else int(trajs),  # in the step, zero-advantage ones too
        excluded=dict(excluded),
        **rstats.summary(),
    )
    return StepResult(metrics, consumed, excluded, trained)


def _single_pass(
    policy: Policy,
    shard: Sequence[Example],
    cfg: TrainConfig,
    idle_tokens: float = 0.0,
    textual: Sequence[TextualExample] = (),
) -> tuple[list[float], RatioStats, TextualSums]:
    """tis / sdpo / reinforce / bc: one forward-backward over the shard (and text examples), one optimiser step."""
    obj = cfg.objective
    stats = RatioStats()
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    pack = _pack(policy, cfg)
    chunks = list(micro_batches(shard, cfg.micro_tokens, pack=pack))
    with lockstep(policy.model, len(chunks), grad=True):  # sharded base: as many passes on every rank
        sums = _passes(policy, cfg, chunks, pack, stats)
    with gathered(policy.model):
        text = textual_backward(
            policy.model,
            policy.pad_id,
            policy.device,
            textual,
            micro_tokens=cfg.micro_tokens,
            clip=obj.clip,
            sdpo_weight=obj.sdpo_weight,
            correction_weight=obj.correction_weight,
            form=obj.sdpo_form,
            k=obj.sdpo_k,
            center=obj.sdpo_center,
        )
    _optimiser_step(policy, cfg, sums[1] + text.tokens, idle_tokens)
    return sums, stats, text


def _passes(
    policy: Policy, cfg: TrainConfig, chunks: Sequence[Sequence[Example]], pack: bool, stats: RatioStats
) -> list[float]:
    """_single_pass's forward-backward over its micro-batches: [loss sum, tokens, rejected, trajectories]."""
    obj = cfg.objective
    loss_sum = tokens = rejected = trajs = 0.0
    for examples in chunks:
        b = collate(examples, policy.pad_id, policy.device, pack=pack)
        logp = _score(policy, b)
        prox = logp.detach()
        mask = b.mask
        if obj.name in ("tis", "sdpo"):
            stats.add(prox, b.behav, mask, obj.clip)
            keep = in_band(sequence_ratio(prox, b.behav, mask), obj.band)
            rejected += float((~keep).sum())
            mask = mask * keep.unsqueeze(1).to(mask.dtype)
            loss = tis_loss(logp, prox, b.behav, mask, b.adv, n_tokens=1, clip=obj.clip)
        elif obj.name == "reinforce":
            stats.add(prox, b.behav, mask, obj.clip)
            loss = reinforce_loss(logp, mask, b.adv, n_tokens=1)
        else:
            loss = bc_loss(logp, mask, n_tokens=1)
        loss.backward()
        loss_sum += float(loss.detach())
        tokens += float(mask.sum())
        trajs += float((mask.sum(dim=1) > 0).sum())
    return [loss_sum, tokens, rejected, trajs]


def _ppo_epochs(
    policy: Policy, shard: Sequence[Example], cfg: TrainConfig, idle_tokens: float = 0.0
) -> tuple[list[float], RatioStats]:
    """Decoupled PPO: π_prox from a no-grad pass, sequence rejection, then ``epochs`` optimiser steps."""
    obj = cfg.objective
    stats = RatioStats()
    rejected = 0.0
    accepted: list[tuple[Batch, torch.Tensor, torch.Tensor]] = []  # (batch, π_prox, mask after rejection)
    policy.model.eval()
    pack = _pack(policy, cfg)
    chunks = list(micro_batches(shard, cfg.micro_tokens, pack=pack))
    with torch.no_grad(), lockstep(policy.model, len(chunks), grad=False):
        for examples in chunks:
            b = collate(examples, policy.pad_id, policy.device, pack=pack)
            prox = _score(policy, b)
            stats.add(prox, b.behav, b.mask, obj.clip)
            keep = in_band(sequence_ratio(prox, b.behav, b.mask), obj.band)
            rejected += float((~keep).sum())
            accepted.append((b, prox, b.mask * keep.unsqueeze(1).to(b.mask.dtype)))
    tokens = float(sum(float(m.sum()) for _, _, m in accepted))
    trajs = float(sum(float((m.sum(dim=1) > 0).sum()) for _, _, m in accepted))
    first_loss = 0.0
    policy.model.train()
    for epoch in range(max(obj.epochs, 1)):
        policy.optimizer.zero_grad(set_to_none=True)
        epoch_loss = 0.0
        with lockstep(policy.model, len(accepted), grad=True):
            for b, prox, mask in accepted:
                logp = _score(policy, b)
                loss = ppo_loss(logp, prox, b.behav, mask, b.adv, n_tokens=1, clip=obj.clip, eps=obj.ppo_eps)
                loss.backward()
                epoch_loss += float(loss.detach())
        if epoch == 0:
            first_loss = epoch_loss
        _optimiser_step(policy, cfg, tokens, idle_tokens)
    return [first_loss, tokens, rejected, trajs], stats


def _score(policy: Policy, b: Batch) -> torch.Tensor:
    """log π of every trained token of a micro-batch under its call's sampling parameters."""
    scored = sequence_logprobs(
        policy.model,
        b.input_ids,
        b.attention_mask,
        b.mask > 0,
        b.temperature,
        b.top_k,
        b.top_p,
        b.min_p,
        packed=b.packed,
    )
    return scored.logprobs


def _pack(policy: Policy, cfg: TrainConfig) -> bool:
    return cfg.pack and packable(policy.model)


def _optimiser_step(policy: Policy, cfg: TrainConfig, local_tokens: float, idle_tokens: float = 0.0) -> None:
    """Sum gradients over ranks, divide by the global token count, clip, step.

    ``idle_tokens``: the whole batch's zero-advantage tokens (the same on every rank), counted
    in the denominator though never computed.
    """
    params = policy.parameters()
    (computed,) = dist.sum_floats([local_tokens])
    total = computed + idle_tokens
    dist.all_reduce_grads(params)
    if computed <= 0:
        policy.optimizer.zero_grad(set_to_none=True)
        return
    for p in params:
        if p.grad is not None:
            p.grad.div_(total)
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)


def _known(policy: Policy, version: int | None, adapters: Mapping[int, Path]) -> bool:
    """Can we reproduce the policy that served a turn? Base, the loaded weights, or a saved adapter."""
    return version is None or (version == policy.version and not policy.dirty) or version in adapters


def _fill_behaviour(
    policy: Policy, examples: Sequence[Example], adapters: Mapping[int, Path], cfg: TrainConfig
) -> None:
    """Recompute missing μ under the adapter that served each turn (no gradient)."""
    by_version: dict[int | None, list[Example]] = {}
    for e in examples:
        for v in {turn.adapter_version for turn in e.trajectory.turns}:
            by_version.setdefault(v, []).append(e)
    policy.model.eval()
    pack = _pack(policy, cfg)
    # The loaded weights served a group: μ = π_prox, which the NaN fill gives exactly.
    todo = {
        v: list(micro_batches(g, cfg.micro_tokens, pack=pack))
        for v, g in by_version.items()
        if not (v == policy.version and not policy.dirty)
    }
    with lockstep(policy.model, sum(len(c) for c in todo.values()), grad=False):
        _fill_groups(policy, todo, adapters, pack)


def _fill_groups(
    policy: Policy, todo: Mapping[int | None, Sequence[Sequence[Example]]], adapters: Mapping[int, Path], pack: bool
) -> None:
    for version, chunks in todo.items():
        with torch.no_grad(), _serving(policy, version, adapters):
            for chunk in chunks:
                b = collate(chunk, policy.pad_id, policy.device, pack=pack)
                logp = _score(policy, b).cpu()
                for row, e in enumerate(chunk):
                    for turn in e.trajectory.turns:
                        if turn.adapter_version != version:
                            continue
                        for t in range(max(turn.start, 1), min(turn.end, e.length)):
                            if e.trajectory.mask[t] and math.isnan(e.behaviour[t]):
                                e.behaviour[t] = float(logp[row, t])


@contextmanager
def _serving(policy: Policy, version: int | None, adapters: Mapping[int, Path]) -> Iterator[None]:
    """Temporarily make the model the policy that served ``version`` (base, current, or a saved one)."""
    if version == policy.version and not policy.dirty:
        yield
        return
    if version is None:
        with policy.model.disable_adapter():
            yield
        return
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = {k: v.detach().clone() for k, v in get_peft_model_state_dict(policy.model).items()}
    weights = load_file(str(Path(adapters[version]) / "adapter_model.safetensors"), device=str(policy.device))
    set_peft_model_state_dict(policy.model, weights)
    try:
        yield
    finally:
        set_peft_model_state_dict(policy.model, saved)
