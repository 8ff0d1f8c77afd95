"""One training step on a fixed batch; writes what each optimiser step was given. Run alone or under torchrun.

Used by test_dist.py: two gloo processes must hand the optimiser the same gradients as one.
Under torchrun the base model is sharded (``TrainConfig.shard``, :mod:`trainer.shard`), so
ppo's no-grad and per-epoch passes run in lock-step here too.
The batch mixes on-policy, stale (ratios ≠ 1, some clipped, one rejected) and
missing behaviour logprobs, and more micro-batches than ranks.

A hook on the optimiser records every step's gradients as the step sees them (all-reduced,
divided by the token count, clipped): that is what data parallelism must reproduce. The
weights after Adam are not: its first step is about lr·sign(g), so an element whose gradient
is ~0 moves by a sizeable fraction of lr on summation-order noise alone. For the same
reason the optimiser here is plain SGD, so ppo's second epoch starts from weights that
differ only by lr times that noise, and its gradients stay comparable too. Every rank
writes its weights: the ranks must hold identical ones after the steps.
"""

from __future__ import annotations

import json
import random
import sys

import torch
from safetensors.torch import save_file

from tests.trainer.helpers import make_trajectory, random_tokens
from trainer import dist
from trainer.advantages import TaskBaseline
from trainer.batch import Example, collate, recorded_behaviour
from trainer.loop import _score, train_step
from trainer.objective import ObjectiveConfig
from trainer.policy import TrainConfig, load_policy

SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": -1, "min_p": 0.0}


def main(out: str, objective: str) -> None:
    dist.init()
    cfg = TrainConfig(
        model="tiny",
        threads=1,
        lr=1e-2,
        micro_tokens=40,
        objective=ObjectiveConfig(name=objective, epochs=2 if objective == "ppo" else 1),
    )  # type: ignore[arg-type]
    policy = load_policy(cfg)
    policy.optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)  # see the docstring: SGD keeps epochs comparable
    names = {id(p): n for n, p in policy.model.named_parameters() if p.requires_grad}
    grads: dict[str, torch.Tensor] = {}

    def record(optimizer: torch.optim.Optimizer, *_: object) -> None:
        step = len({k.split(":")[0] for k in grads})
        for group in optimizer.param_groups:
            for p in group["params"]:
                grads[f"{step}:{names[id(p)]}"] = (p.grad if p.grad is not None else torch.zeros_like(p)).clone()

    policy.optimizer.register_step_pre_hook(record)
    rng = random.Random(0)
    trajectories = [
        make_trajectory(
            f"t{i}",
            random_tokens(rng, rng.randrange(4, 12)),
            random_tokens(rng, rng.randrange(2, 8)),
            reward=rng.random(),
            sampling=SAMPLING,
            task=f"task{i % 3}",
            group=f"g{i % 4}",
        )
        for i in range(11)
    ]
    batch = collate([Example(t, 0.0, recorded_behaviour(t)) for t in trajectories], policy.pad_id)
    with torch.no_grad():
        lp = _score(policy, batch)
    for row, t in enumerate(trajectories):
        shift = 1.0 if row == 0 else 0.4 * (rng.random() - 0.5)  # row 0 lands outside the band
        t.logprobs = [float(lp[row, j]) - shift if t.mask[j] else None for j in range(len(t.token_ids))]
    trajectories[3].logprobs = [None] * len(trajectories[3].token_ids)
    result = train_step(policy, trajectories, cfg, TaskBaseline())
    from peft import get_peft_model_state_dict

    weights = {k: v.contiguous() for k, v in get_peft_model_state_dict(policy.model).items()}
    save_file(weights, f"{out}.rank{dist.rank()}.safetensors")
    if dist.rank() == 0:
        save_file(grads, f"{out}.grads.safetensors")
        with open(f"{out}.json", "w") as fh:
            json.dump({"world": dist.world(), **result.metrics}, fh)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
