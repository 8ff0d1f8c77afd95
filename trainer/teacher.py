"""The SDPO teacher: a frozen snapshot of the serving version's LoRA weights, never the weights being stepped.

Why (issue 35): with the live student as its own teacher, every step moves the
teacher too, and the pair can drift together into degenerate replies (the demo's
comments arm went 48.5 → 47.6 → 0.0). Later work on self-distillation reports the
same: a stable or slowly updated teacher holds where a fast-moving one diverges.

How: :class:`Teacher` keeps one detached copy of every trainable LoRA tensor, taken
when the policy is loaded (the parent adapter, which is what serves, or a fresh LoRA,
which equals the base). For the teacher's no-grad pass :meth:`Teacher.swapped` exchanges
each parameter's storage with its copy (``p.data`` pointers: no copy, no second
model), and back afterwards. Chosen over PEFT's second adapter (``load_adapter(...,
adapter_name="teacher")`` + ``set_adapter``) because that one is saved by
``save_pretrained`` into every published folder and ``set_adapter`` toggles
``requires_grad`` on the trained adapter; the memory is the same (one LoRA copy) and
the swap costs microseconds (bench figures in docs/architecture.md, "Objectives").

Modes (``--sdpo-teacher``): ``frozen`` (the default: the snapshot stays as loaded;
a run that switches to another serving parent loads a new policy, so a new snapshot),
``ema`` (before each step the snapshot moves ``rate`` of the way to the current
weights: a slow teacher), ``live`` (the weights being stepped, the old behaviour, kept
to measure against). Whatever the mode the snapshot also anchors the KL constraint
(:func:`trainer.sdpo.kl_to_reference`) and carries the log-ratio clip.

:mod:`trainer.loop` hands :func:`trainer.textual_step.textual_backward` the model alone,
so the teacher rides on the model (:func:`attach`, :func:`attached`); a policy not built
for ``sdpo`` has none, and the bare passes then use the live model, unclipped, unanchored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Mode = Literal["frozen", "ema", "live"]
ATTRIBUTE = "onthejob_teacher"  # where the teacher rides on the model it shadows


def _trainable(model: Any) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


@dataclass
class Teacher:
    """The serving version's LoRA weights (one detached copy) and how SDPO uses them."""

    weights: dict[str, torch.Tensor]
    mode: Mode = "frozen"
    rate: float = 0.05  # ema: fraction of the way to the current weights, per step
    signal_clip: float = 2.0  # |log π_T − log π_S| is clipped to this (0: unclipped)
    kl: float = 0.1  # weight of KL(π_S ‖ serving) beside the self-distillation loss
    steps: int = field(default=0, init=False)  # ema updates done

    @classmethod
    def of(
        cls, model: Any, mode: Mode = "frozen", rate: float = 0.05, signal_clip: float = 2.0, kl: float = 0.1
    ) -> Teacher:
        """A snapshot of ``model``'s trainable tensors as they are now."""
        weights = {name: p.detach().clone() for name, p in _trainable(model).items()}
        if not weights:
            raise ValueError("the model has no trainable tensors to snapshot: is it a LoRA model?")
        return cls(weights, mode, rate, signal_clip, kl)

    def bytes(self) -> int:
        """Memory the snapshot holds: one copy of the LoRA tensors."""
        return sum(w.numel() * w.element_size() for w in self.weights.values())

    def moved(self, model: Any) -> bool:
        """Whether the trained weights differ from the snapshot (if not, π_S = π_serving exactly)."""
        params = _trainable(model)
        return any(not torch.equal(params[name], w) for name, w in self.weights.items())

    @torch.no_grad()
    def update(self, model: Any) -> None:
        """``ema``: move the snapshot ``rate`` of the way to the current weights (other modes: nothing)."""
        if self.mode != "ema" or self.rate <= 0:
            return
        params = _trainable(model)
        for name, w in self.weights.items():
            w.lerp_(params[name].detach(), self.rate)
        self.steps += 1

    @contextmanager
    def swapped(self, model: Any) -> Iterator[None]:
        """Inside, ``model`` computes with the snapshot's weights; the trained ones are back afterwards.

        Only for no-grad passes: the exchange is of storage, so a graph built inside would
        refer to the snapshot. Gradients already accumulated in ``.grad`` are untouched.
        """
        params = _trainable(model)
        if set(params) != set(self.weights):
            raise ValueError("the model's trainable tensors are not those the teacher snapshotted")
        self._exchange(params)
        try:
            yield
        finally:
            self._exchange(params)

    def _exchange(self, params: dict[str, torch.nn.Parameter]) -> None:
        for name, p in params.items():
            p.data, self.weights[name] = self.weights[name], p.data

    @contextmanager
    def teaching(self, model: Any) -> Iterator[None]:
        """The weights the teacher's pass uses: the snapshot, or (``live``) the trained ones."""
        if self.mode == "live":
            yield
            return
        with self.swapped(model):
            yield


def attach(model: Any, teacher: Teacher) -> None:
    """Let ``teacher`` ride on ``model`` (what :func:`trainer.textual_step.textual_backward` reads)."""
    object.__setattr__(model, ATTRIBUTE, teacher)


def attached(model: Any) -> Teacher | None:
    """The teacher riding on ``model``, if any."""
    found = model.__dict__.get(ATTRIBUTE) if hasattr(model, "__dict__") else None
    return found if isinstance(found, Teacher) else None
