"""One TIS step, then one SDPO step (with text feedback), on fixed batches; run alone or under torchrun.

Used by test_shard.py: two gloo ranks with the base model sharded (:mod:`trainer.shard`) must
compute the same loss, hand the optimiser the same LoRA gradients and save the same adapter
as one process. As in ddp_step.py the optimiser is plain SGD (Adam's first step is about
lr·sign(g), which turns summation-order noise into sizeable weight differences), and a hook
records each step's gradients as the optimiser sees them. Rank 0 saves the adapter after each
step the way the runner publishes it (``save_adapter``); every rank writes its LoRA weights.

Arguments: one or more outputs, each trained from a fresh policy in turn (``load_policy`` seeds
it, so a later run starts where a process of its own would). An output written ``skew:PATH`` has
rank 1 train on other trajectories than the batch, which the test uses to show that the comparison
can fail; the test runs it in the same torchrun launch as the equal run, saving a launch (most of
a run's time is importing torch and transformers).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from storage.trajectories import Trajectory
from tests.trainer.helpers import make_trajectory, random_tokens
from trainer import dist
from trainer.advantages import TaskBaseline
from trainer.loop import train_step
from trainer.objective import ObjectiveConfig
from trainer.policy import TrainConfig, load_policy
from trainer.publish import save_adapter
from trainer.shard import sharded_names
from trainer.textual import Hint, TextualExample

SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": -1, "min_p": 0.0}


def _batch(seed: int, n: int) -> list[Trajectory]:
    """Base-served trajectories without recorded μ: recomputed under the base once the LoRA has moved.

    Three long ones go to rank 0 of two, so its shard takes more micro-batches than rank 1's
    (the lock-step's empty passes are exercised).
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, sampled = random_tokens(rng, rng.randrange(4, 12)), random_tokens(rng, rng.randrange(2, 8))
        if i % 2 == 0 and i < 6:
            prompt += random_tokens(rng, 24)  # rank 0's shard takes more micro-batches: rank 1 pads
        lps: list[float | None] = [None] * len(sampled)
        out.append(
            make_trajectory(
                f"t{seed}-{i}",
                prompt,
                sampled,
                logprobs=lps,
                reward=rng.random(),
                sampling=SAMPLING,
                task=f"task{i % 3}",
                group=f"g{i % 4}",
            )
        )
    return out


def _textual(seed: int, n: int) -> list[TextualExample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, sampled = random_tokens(rng, rng.randrange(4, 10)), random_tokens(rng, rng.randrange(3, 8))
        hint = random_tokens(rng, rng.randrange(2, 6))
        student = make_trajectory(f"s{i}", prompt, sampled, reward=None, sampling=SAMPLING)
        teacher = make_trajectory(f"s{i}-t", prompt + hint, sampled, reward=None, sampling=SAMPLING)
        out.append(TextualExample("sdpo", Hint(f"cmpl-s{i}", f"f{i}", "comment", "x"), student, teacher))
    return out


def main(outputs: list[str]) -> None:
    dist.init()
    for out in outputs:
        skew = out.startswith("skew:")
        train(out.removeprefix("skew:"), skew)
    dist.close()


def train(out: str, skew: bool) -> None:
    """One TIS step then one SDPO step from a fresh policy; writes ``out``'s adapters, gradients and metrics."""
    sdpo = ObjectiveConfig(name="sdpo")
    cfg = TrainConfig(model="tiny", threads=1, lr=1e-2, micro_tokens=40, objective=sdpo)
    policy = load_policy(cfg)
    policy.optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)  # see the docstring
    names = {id(p): n for n, p in policy.model.named_parameters() if p.requires_grad}
    grads: dict[str, torch.Tensor] = {}

    def record(optimizer: torch.optim.Optimizer, *_: object) -> None:
        step = len({k.split(":")[0] for k in grads})
        for group in optimizer.param_groups:
            for p in group["params"]:
                grads[f"{step}:{names[id(p)]}"] = (p.grad if p.grad is not None else torch.zeros_like(p)).clone()

    policy.optimizer.register_step_pre_hook(record)
    other = skew and dist.rank() == 1
    metrics = []
    tis = TrainConfig(**{**cfg.__dict__, "objective": ObjectiveConfig(name="tis")})
    for step, (scfg, textual) in enumerate([(tis, []), (cfg, _textual(7 if other else 5, 5))]):
        result = train_step(policy, _batch(3 if other else 1, 11), scfg, TaskBaseline(), textual=textual)
        metrics.append(result.metrics)
        if dist.rank() == 0:
            save_adapter(policy.model, Path(f"{out}.adapter{step}"))
        dist.barrier()
    from peft import get_peft_model_state_dict

    weights = {k: v.contiguous() for k, v in get_peft_model_state_dict(policy.model).items()}
    save_file(weights, f"{out}.rank{dist.rank()}.safetensors")
    if dist.rank() == 0:
        save_file(grads, f"{out}.grads.safetensors")
        info = {"world": dist.world(), "sharded": len(sharded_names(policy.model)), "steps": metrics}
        Path(f"{out}.json").write_text(json.dumps(info))
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
