"""One settings object per ``onthejob train`` process, validated once when it is built.

The CLI builds it from flags and the environment (the one place the trainer's
process reads ``ONTHEJOB_ADMIN_KEY`` and ``DATABASE_URL``); everything below
:func:`trainer.runner.run` reads fields of this object, never flags. The
per-step knobs live in :class:`trainer.policy.TrainConfig`, derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast, get_args

from trainer.errors import TrainerError
from trainer.objective import Objective, ObjectiveConfig
from trainer.policy import TrainConfig
from trainer.teacher import Mode

PPO_EPOCHS = 4
PARENT_WORDS = ("latest", "deployed", "base")


class SettingsError(TrainerError):
    """A setting that cannot work; the message names the flag and what it accepts."""


@dataclass(frozen=True)
class TrainSettings:
    """What one training run does: which alias, from which data, how, and where its adapters go."""

    alias: str
    database_url: str
    model: str = "default"  # default | tiny | PATH: the engine's base model
    project: str = "default"
    objective: str = "tis"
    lr: float = 2e-4
    batch_size: int = 32  # trajectories per step, at most
    min_batch: int = 1  # wait until at least this many are graded
    max_len: int = 2048  # longer trajectories are dropped and counted
    threads: int | None = None  # None: the cores divided among the ranks
    fresh_optimizer: bool = False  # start AdamW afresh instead of the parent's saved moments
    parent: str = "latest"  # latest | deployed | base | a version number
    steps: int | None = 1  # None: no limit (with watch)
    watch: bool = False  # keep polling for newly graded traffic
    poll_s: float = 10.0
    adapters: Path = Path("adapters")  # a folder the engines can read
    proxy: str = "http://127.0.0.1:8000"  # whose admin API deploys what we publish
    admin_key: str | None = None
    deploy: bool = True
    sdpo_weight: float = 1.0  # --objective sdpo: weight of self-distillation against the scored part
    correction_weight: float = 1.0  # --objective sdpo: weight of filtered SFT on corrections
    sdpo_form: str = "token"  # token (sampled-token signal) | topk (top-k + tail reverse KL)
    sdpo_baseline: str = "none"  # token form: none | mean (centre the signal over the chunk's tokens)
    sdpo_teacher: str = "frozen"  # frozen (the serving version) | ema (a slow average) | live (the stepped weights)
    sdpo_ema: float = 0.05  # --sdpo-teacher ema: fraction of the way to the current weights per step
    sdpo_signal_clip: float = 2.0  # |log π_T − log π_S| per token clipped to this; 0: unclipped
    sdpo_kl: float = 0.1  # weight of KL(student ‖ serving version) in the self-distillation part
    step_floor: float = 0.0  # > 0: AdamW's ε, so a weak gradient takes a small step (trainer/policy.py)
    dataset: str | None = None  # train exactly this dataset's pinned items (storage/datasets.py), then stop

    def __post_init__(self) -> None:
        if not self.alias:
            raise SettingsError("--alias is empty: name the alias whose traffic to train on")
        if self.objective not in get_args(Objective):
            raise SettingsError(f"--objective {self.objective!r}: use one of {', '.join(get_args(Objective))}")
        if not self.lr > 0:
            raise SettingsError(f"--lr {self.lr}: the learning rate must be positive")
        for flag, value in (
            ("--batch-size", self.batch_size),
            ("--min-batch", self.min_batch),
            ("--max-len", self.max_len),
        ):
            if value < 1:
                raise SettingsError(f"{flag} {value}: must be at least 1")
        if self.threads is not None and self.threads < 1:
            raise SettingsError(f"--threads {self.threads}: must be at least 1 (or left out)")
        if self.steps is not None and self.steps < 0:
            raise SettingsError(f"--steps {self.steps}: must be 0 or more")
        if self.poll_s < 0:
            raise SettingsError(f"--poll {self.poll_s}: must be 0 or more seconds")
        for flag, weight in (("--sdpo-weight", self.sdpo_weight), ("--correction-weight", self.correction_weight)):
            if not weight >= 0:
                raise SettingsError(f"{flag} {weight}: must be 0 or more")
        if self.sdpo_form not in ("token", "topk"):
            raise SettingsError(f"--sdpo-form {self.sdpo_form!r}: use token or topk")
        if self.sdpo_baseline not in ("none", "mean"):
            raise SettingsError(f"--sdpo-baseline {self.sdpo_baseline!r}: use none or mean")
        if self.sdpo_teacher not in ("frozen", "ema", "live"):
            raise SettingsError(f"--sdpo-teacher {self.sdpo_teacher!r}: use frozen, ema or live")
        if not 0 < self.sdpo_ema <= 1:
            raise SettingsError(f"--sdpo-ema {self.sdpo_ema}: a fraction in (0, 1]")
        for flag, amount in (
            ("--sdpo-signal-clip", self.sdpo_signal_clip),
            ("--sdpo-kl", self.sdpo_kl),
            ("--step-floor", self.step_floor),
        ):
            if not amount >= 0:
                raise SettingsError(f"{flag} {amount}: must be 0 or more")
        if self.parent not in PARENT_WORDS and not self.parent.isdigit():
            raise SettingsError(f"--parent {self.parent!r}: use latest, deployed, base or a version number")
        if self.dataset is not None and (self.watch or self.objective == "sdpo"):
            raise SettingsError(
                f"--dataset {self.dataset!r} is a fixed set: it trains with tis, ppo or bc, without --watch"
            )
        object.__setattr__(self, "adapters", Path(self.adapters))

    @property
    def parent_version(self) -> int | None:
        """The version ``--parent N`` names; None for latest, deployed and base."""
        return int(self.parent) if self.parent.isdigit() else None

    def train_config(self) -> TrainConfig:
        """The per-step config: the objective (PPO takes several epochs), lr, threads, length limit."""
        objective = ObjectiveConfig(
            name=cast(Objective, self.objective),
            epochs=PPO_EPOCHS if self.objective == "ppo" else 1,
            sdpo_weight=self.sdpo_weight,
            correction_weight=self.correction_weight,
            sdpo_form="topk" if self.sdpo_form == "topk" else "token",
            sdpo_center=self.sdpo_baseline == "mean",
            sdpo_teacher=cast(Mode, self.sdpo_teacher),
            sdpo_ema=self.sdpo_ema,
            sdpo_signal_clip=self.sdpo_signal_clip,
            sdpo_kl=self.sdpo_kl,
        )
        cfg = TrainConfig(
            model=self.model,
            objective=objective,
            lr=self.lr,
            threads=self.threads,
            resume_optimizer=not self.fresh_optimizer,
            step_floor=self.step_floor,
        )
        return replace(cfg, max_len=self.max_len)
