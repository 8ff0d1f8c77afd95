"""The model a step trains: the base weights (hash-checked) with a LoRA adapter, and how it is configured.

:class:`TrainConfig` is everything a step needs to know; :func:`load_policy` builds the
:class:`Policy` (base weights as the engine loaded them, a fresh LoRA or a parent
adapter with its optimiser moments) that :func:`trainer.loop.train_step` updates.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.launcher import MAX_LORA_RANK, model_dtype
from engine.weights import ModelInfo, resolve_model, weights_sha256
from trainer import dist
from trainer.checkpoint import resume_optimizer
from trainer.errors import BaseModelError, DataError
from trainer.objective import ObjectiveConfig
from trainer.teacher import Teacher, attach

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAM_EPS = 1e-8  # torch's default: with it, a fresh AdamW's first step is ±lr on every weight, whatever g's size

# A step whose size answers to its signal (``step_floor``): AdamW moves each weight by
# lr · m̂/(√v̂ + ε). With ε ≈ 0 that is ±lr on a fresh optimiser's first step whether the
# gradient comes from 25,000 graded tokens or from 700 noisy teacher-student ones. With ε a
# gradient scale F, a coordinate whose |g| ≪ F moves by ≈ lr·g/F (in proportion to its
# signal) and one whose |g| ≫ F still by at most lr: a per-weight trust region of radius lr
# that a weak or self-cancelling gradient does not fill.


@dataclass
class TrainConfig:
    """Everything a step needs to know; defaults fit a laptop and the engine's LoRA limits."""

    model: str = "default"
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    lr: float = 2e-4
    rank: int = 16  # the engine starts with --max-lora-rank 16
    alpha: int = 32
    max_len: int = 2048  # longer trajectories are dropped (and counted), never truncated
    micro_tokens: int = 4096  # padded tokens per forward pass
    pack: bool = True  # several short trajectories to a row where the model's attention allows it
    grad_clip: float = 1.0
    threads: int | None = None  # None: the CPU cores divided among the ranks
    resume_optimizer: bool = True  # continue the parent adapter's AdamW moments when it saved them
    step_floor: float = 0.0  # > 0: AdamW's ε, the gradient size below which a step shrinks with it (see below)
    seed: int = 0
    shard: bool = True  # under torchrun: the base model's decoder layers sharded over the ranks (trainer.shard)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Policy:
    """The base model with its LoRA adapter, the optimiser, and which adapter version the weights are."""

    model: Any  # peft.PeftModel
    info: ModelInfo
    optimizer: torch.optim.Optimizer
    pad_id: int
    device: torch.device
    version: int | None = None  # the published version these weights equal; None: a fresh LoRA (= base)
    dirty: bool = False  # trained since ``version``: the weights are no published adapter

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def set_threads(threads: int | None) -> int:
    """Bound intra-op threads: the CPU cores shared by the ranks (engines may want some too)."""
    n = threads or max(1, (os.cpu_count() or 1) // dist.world())
    torch.set_num_threads(n)
    return n


def check_weights(info: ModelInfo) -> None:
    """The files on disk must hash to the recorded sha256 the engine was started with."""
    actual = weights_sha256(info.path)
    if actual != info.sha256:
        raise BaseModelError(
            f"base weights in {info.path} hash to {actual[:12]}, but {info.sha256[:12]} is recorded; "
            "the cache was modified: delete the folder and let it be rebuilt"
        )


def build_optimizer(
    params: list[torch.nn.Parameter], cfg: TrainConfig, moments: Path | None = None
) -> torch.optim.AdamW:
    """AdamW over ``params`` with this run's lr and step floor, continuing the moments saved in ``moments``."""
    eps = cfg.step_floor if cfg.step_floor > 0 else ADAM_EPS
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, eps=eps)
    if moments is not None:
        resume_optimizer(optimizer, moments, cfg.lr)
        for group in optimizer.param_groups:
            group["eps"] = eps  # this run's floor, not the one the moments were saved with
    return optimizer


def load_policy(cfg: TrainConfig, parent: Path | None = None, parent_version: int | None = None) -> Policy:
    """Load the engine's base weights (hash-checked) and wrap them in a LoRA, fresh or from ``parent``."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    set_threads(cfg.threads)
    if cfg.rank > MAX_LORA_RANK:
        raise DataError(f"LoRA rank {cfg.rank} exceeds the engine's --max-lora-rank {MAX_LORA_RANK}")
    info = resolve_model(cfg.model)
    check_weights(info)
    device = dist.device()
    base: Any = AutoModelForCausalLM.from_pretrained(info.path, dtype=getattr(torch, model_dtype(info)))
    base = base.to(device)
    torch.manual_seed(cfg.seed)
    if parent is not None:
        model = PeftModel.from_pretrained(base, str(parent), is_trainable=True)
        rank = int(getattr(model.peft_config["default"], "r", 0))
        if rank > MAX_LORA_RANK:
            raise DataError(f"parent adapter {parent} has rank {rank} > the engine's --max-lora-rank {MAX_LORA_RANK}")
    else:
        lora = LoraConfig(
            r=cfg.rank,
            lora_alpha=cfg.alpha,
            lora_dropout=0.0,  # no dropout: π_prox must equal π_θ
            target_modules=list(TARGET_MODULES),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    dist.broadcast_params(params)  # LoRA A is initialised at random: every rank starts from rank 0's
    pad = base.config.pad_token_id
    pad_id = int(pad) if isinstance(pad, int) else 0  # padding is never attended to nor scored
    if cfg.shard:
        from trainer.shard import shard

        shard(model, pad_id)  # under torchrun only; the LoRA parameters stay whole, so ``params`` is unchanged
    optimizer = build_optimizer(params, cfg, parent if cfg.resume_optimizer else None)
    if cfg.objective.name == "sdpo":
        obj = cfg.objective
        attach(model, Teacher.of(model, obj.sdpo_teacher, obj.sdpo_ema, obj.sdpo_signal_clip, obj.sdpo_kl))
    return Policy(model, info, optimizer, pad_id, device, version=parent_version if parent else None)
