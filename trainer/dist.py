"""Data parallelism without a framework: shard the batch, all-reduce summed gradients.

Under ``torchrun`` (any ``WORLD_SIZE``, one rank included) every rank holds the whole step's list of
trajectories (rank 0 loads it and broadcasts), computes advantages the same way,
trains on its shard ``examples[rank::world]`` and adds its *unnormalised*
gradient into an all-reduce. The sum, divided by the global token count, is
exactly the one-process gradient, so every rank's optimiser takes the same
step and the weights stay identical without DDP's wrapper (which would also
get in the way of PEFT's ``disable_adapter`` and of ``logits_to_keep``).
Gloo on CPU, NCCL on GPUs; one process needs none of this.

Under torchrun the base model is also sharded over the ranks (:mod:`trainer.shard`, FSDP2;
``TrainConfig.shard``): each rank then holds 1/world of the decoder layers' frozen weights
rather than the whole model. The LoRA parameters are not sharded, so everything here (the
broadcast at load, the gradient all-reduce, rank 0 saving) applies unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as td

T = TypeVar("T")


def init() -> None:
    """Join the process group when launched by torchrun (a world of one too); a no-op in a plain process.

    A world of one is a group so that one rank runs the sharded code path (:mod:`trainer.shard`:
    FSDP2 over a mesh of one) exactly as each of several does; what needs a peer
    (:func:`active`: broadcasts, all-reduces, barriers) stays a no-op there.
    """
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ
    if launched and not td.is_initialized():
        td.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


def close() -> None:
    """Leave the process group (torchrun warns when a process exits without doing so)."""
    if td.is_available() and td.is_initialized():
        td.destroy_process_group()


def active() -> bool:
    """Ranks to talk to: a group of two or more."""
    return joined() and td.get_world_size() > 1


def joined() -> bool:
    """In a process group (under torchrun), of any size."""
    return td.is_available() and td.is_initialized()


def rank() -> int:
    return td.get_rank() if active() else 0


def world() -> int:
    return td.get_world_size() if active() else 1


def device() -> torch.device:
    """This rank's device: its GPU under torchrun on GPUs, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def broadcast(obj: T) -> T:
    """Rank 0's value of ``obj`` on every rank."""
    if not active():
        return obj
    box: list[Any] = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def broadcast_params(params: Iterable[torch.Tensor]) -> None:
    """Make every rank start from rank 0's weights (LoRA init is random)."""
    if active():
        for p in params:
            td.broadcast(p.data, src=0)


def all_reduce_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks, in place; a parameter with no gradient counts as zeros."""
    if not active():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        td.all_reduce(p.grad, op=td.ReduceOp.SUM)


def sum_floats(values: list[float], dev: torch.device | None = None) -> list[float]:
    """Element-wise sum over ranks."""
    if not active():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=dev or device())
    td.all_reduce(t, op=td.ReduceOp.SUM)
    return [float(x) for x in t.tolist()]


def max_float(value: float, dev: torch.device | None = None) -> float:
    """Maximum over ranks."""
    if not active():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=dev or device())
    td.all_reduce(t, op=td.ReduceOp.MAX)
    return float(t.item())


def barrier() -> None:
    if active():
        td.barrier()
