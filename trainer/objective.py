"""Losses for off-policy LoRA updates: truncated importance sampling (default), decoupled PPO, BC.

All functions are pure over right-padded ``[B, T]`` tensors:

* ``logp``   log π_θ of each token (carries the gradient),
* ``prox``   log π_prox, the trainer's policy before this step (no gradient),
* ``behav``  log μ, the engine's recorded behaviour logprob (NaN where unknown),
* ``mask``   1.0 on sampled tokens that are trained on, 0.0 elsewhere,
* ``adv``    one advantage per sequence, ``[B]``.

Every loss is a *sum* over tokens divided by ``n_tokens``, the number of trained
tokens in the whole step (all micro-batches, all ranks), so micro-batching and
data parallelism give the same gradient as one big batch.

Why TIS by default (Yao et al.): logged traffic was sampled by an older adapter
(μ ≠ π). Weighting each token by sg(min(π_prox/μ, C)) corrects for that lag
while the truncation at C bounds the variance; sequences whose geometric-mean
ratio leaves a band are too far off-policy to correct and are rejected. A
missing μ gets weight 1 (the caller decides whether such a sequence may be used).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# "sdpo": the scored part is "tis"; text feedback adds self-distillation and correction parts (trainer.sdpo).
Objective = Literal["tis", "ppo", "bc", "reinforce", "sdpo"]


@dataclass(frozen=True)
class ObjectiveConfig:
    """Knobs of the objectives; the defaults are the documented ones."""

    name: Objective = "tis"
    clip: float = 2.0  # C: truncation of the behaviour weight π_prox/μ
    band: tuple[float, float] = (0.5, 2.0)  # accepted geometric-mean sequence ratio
    ppo_eps: float = 0.2  # PPO clip range of π_θ/π_prox
    epochs: int = 1  # passes over the batch ("ppo" uses several)
    bc_threshold: float = 0.5  # "bc": clone trajectories with reward ≥ this
    sdpo_weight: float = 1.0  # "sdpo": weight of the self-distillation part against the scored one
    correction_weight: float = 1.0  # "sdpo": weight of filtered SFT on corrections
    sdpo_form: Literal["token", "topk"] = "token"  # the sampled-token signal, or top-k + tail reverse KL
    sdpo_center: bool = False  # token form: subtract the chunk's mean signal (a baseline) before weighting
    sdpo_k: int = 20
    sdpo_teacher: Literal["frozen", "ema", "live"] = "frozen"  # trainer.teacher: never the weights being stepped
    sdpo_ema: float = 0.05  # "ema" teacher: fraction of the way to the current weights per step
    sdpo_signal_clip: float = 2.0  # |log π_T − log π_S| per token is clipped to this (0: unclipped)
    sdpo_kl: float = 0.1  # weight of KL(π_S ‖ serving version) beside the self-distillation part


def behaviour(prox: torch.Tensor, behav: torch.Tensor) -> torch.Tensor:
    """μ with gaps filled by π_prox, so a token with unknown μ has ratio exactly 1."""
    return torch.where(torch.isnan(behav), prox, behav)


def token_ratio(prox: torch.Tensor, behav: torch.Tensor) -> torch.Tensor:
    """π_prox/μ per token (1 where μ is unknown)."""
    return torch.exp(prox - behaviour(prox, behav))


def sequence_ratio(prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(mean_t log(π_prox/μ)) over each sequence's masked tokens with known μ; 1 when none."""
    known = mask * (~torch.isnan(behav)).to(mask.dtype)
    log_ratio = (prox - behaviour(prox, behav)) * known
    count = known.sum(dim=1)
    return torch.exp(log_ratio.sum(dim=1) / count.clamp(min=1))


def in_band(ratio: torch.Tensor, band: tuple[float, float]) -> torch.Tensor:
    """Which sequences are close enough to on-policy to correct (``[B]`` bool)."""
    low, high = band
    return (ratio >= low) & (ratio <= high)


def _per_token_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return adv.to(mask.dtype).unsqueeze(1) * mask


def tis_loss(
    logp: torch.Tensor,
    prox: torch.Tensor,
    behav: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    n_tokens: int,
    clip: float = 2.0,
) -> torch.Tensor:
    """−(1/N) Σ m · sg(min(π_prox/μ, C)) · A · log π_θ."""
    weight = token_ratio(prox, behav).clamp(max=clip).detach()
    return -(weight * _per_token_adv(adv, mask) * logp).sum() / max(n_tokens, 1)


def reinforce_loss(logp: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """−(1/N) Σ m · A · log π_θ: plain REINFORCE, no off-policy correction (a baseline to compare)."""
    return -(_per_token_adv(adv, mask) * logp).sum() / max(n_tokens, 1)


def ppo_loss(
    logp: torch.Tensor,
    prox: torch.Tensor,
    behav: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    n_tokens: int,
    clip: float = 2.0,
    eps: float = 0.2,
) -> torch.Tensor:
    """Decoupled PPO (AReaL): −(1/N) Σ m · sg(min(π_prox/μ, C)) · min(r·A, clip(r, 1±ε)·A), r = π_θ/π_prox.

    At the first epoch π_θ = π_prox, so its gradient equals :func:`tis_loss`'s;
    later epochs are held near π_prox by the clipped ratio.
    """
    weight = token_ratio(prox, behav).clamp(max=clip).detach()
    ratio = torch.exp(logp - prox.detach())
    a = adv.to(logp.dtype).unsqueeze(1)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    return -(weight * mask * surrogate).sum() / max(n_tokens, 1)


def bc_loss(logp: torch.Tensor, mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """−(1/N) Σ m · log π_θ: behaviour cloning of the (already filtered) sequences."""
    return -(mask * logp).sum() / max(n_tokens, 1)


@dataclass
class RatioStats:
    """Sums over tokens with known μ, mergeable across micro-batches and ranks."""

    tokens: float = 0.0
    ratio_sum: float = 0.0
    ratio_sq_sum: float = 0.0
    ratio_max: float = 0.0
    clipped: float = 0.0
    kl_sum: float = 0.0

    def add(self, prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor, clip: float) -> None:
        """Fold in one micro-batch (only masked tokens whose μ is known count)."""
        known = (mask > 0) & ~torch.isnan(behav)
        if not bool(known.any()):
            return
        log_r = (prox - behav)[known].double()
        r = torch.exp(log_r)
        self.tokens += float(known.sum())
        self.ratio_sum += float(r.sum())
        self.ratio_sq_sum += float((r * r).sum())
        self.ratio_max = max(self.ratio_max, float(r.max()))
        self.clipped += float((r > clip).sum())
        # k3 estimator of KL(μ‖π) from tokens sampled by μ: E_μ[r − 1 − log r] ≥ 0.
        self.kl_sum += float((r - 1 - log_r).sum())

    def as_vector(self) -> list[float]:
        return [self.tokens, self.ratio_sum, self.ratio_sq_sum, self.clipped, self.kl_sum]

    def summary(self) -> dict[str, float]:
        """ratio mean/max, clipped fraction, normalised effective sample size, KL(μ‖π)."""
        if self.tokens == 0:
            return {"ratio_mean": 1.0, "ratio_max": 1.0, "clipped_frac": 0.0, "ess": 1.0, "kl_mu_pi": 0.0}
        return {
            "ratio_mean": self.ratio_sum / self.tokens,
            "ratio_max": self.ratio_max,
            "clipped_frac": self.clipped / self.tokens,
            "ess": self.ratio_sum**2 / (self.tokens * self.ratio_sq_sum) if self.ratio_sq_sum else 1.0,
            "kl_mu_pi": self.kl_sum / self.tokens,
        }
