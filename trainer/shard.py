"""The base model sharded over the ranks (PyTorch FSDP2 ``fully_shard``); the LoRA stays whole on each.

Under ``torchrun`` each rank keeps 1/world of every decoder layer's frozen base weights
and all-gathers a layer just before using it (forward, and again in backward), so a base
model too big for one device trains on several. The LoRA tensors are left out of the
sharding (``ignored_params``): they are a few MiB, so they stay ordinary replicated
parameters and everything built on them is unchanged: rank 0's LoRA is broadcast at load
(:func:`trainer.dist.broadcast_params`), gradients are summed by
:func:`trainer.dist.all_reduce_grads`, every rank's AdamW takes the same step, the SDPO
teacher's storage swap works on plain tensors, and rank 0 saves the adapter with
``save_pretrained`` exactly as one process does (same keys, dtypes and files). The frozen
base weights get no gradient, so backward issues no reduce-scatter.

The embedding, final norm and LM head stay whole too: the tiny model ties its head to the
embedding, and :func:`trainer.logprobs.sequence_logprobs` calls the decoder and then the
head in chunks whose number depends on the batch, which would need as many gathers.

Lock-step. A sharded forward is a collective: every rank must run the same number of
decoder passes, of the same kind, in the same order, or the ranks all-gather different
layers (and hang or mix shards). The data-parallel shards of a step differ in size, so
each pass loop in :mod:`trainer.loop` says up front how many forwards it will run
(:func:`lockstep`); ranks agree on the largest count and those with fewer run empty ones
(a two-token pass, zero loss) after their real ones. The text-feedback passes
(:func:`trainer.textual_step.textual_backward`) interleave teacher and student passes
in a data-dependent order, so they run with every layer gathered for their duration
(:func:`gathered`): no collectives inside, at the cost of the whole decoder's weights in
memory meanwhile. In a plain process (not under torchrun), or with ``TrainConfig.shard`` off,
all of this is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as td

from trainer import dist

ATTRIBUTE = "onthejob_shard"  # where the sharding state rides on the model


@dataclass
class Sharding:
    """The sharded decoder, its FSDP layers, and the decoder passes counted since the last lock-step."""

    decoder: Any
    layers: list[Any]
    pad_id: int
    calls: list[bool] = field(default_factory=list)  # one per decoder forward: grad enabled?
    whole: bool = False  # inside :func:`gathered`: passes issue no collectives and are not counted


def decoder_of(model: Any) -> Any:
    """The PEFT model's decoder (ids → hidden states), whose ``layers`` are sharded."""
    get_base = getattr(model, "get_base_model", None)
    base: Any = get_base() if callable(get_base) else model
    decoder = base.get_decoder()
    if not hasattr(decoder, "layers"):
        raise TypeError(f"{type(decoder).__name__} has no .layers to shard")
    return decoder


def shard(model: Any, pad_id: int) -> Sharding | None:
    """Shard ``model``'s decoder layers over the world (no-op outside torchrun); LoRA parameters stay whole.

    Under torchrun with one rank the layers are FSDP units over a mesh of one: every shard is
    the whole tensor, and the code path is the one several ranks run (what a lone GPU can check).
    """
    if not dist.joined():
        return None
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dev = dist.device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # NCCL: this rank's GPU
    mesh = init_device_mesh(dev.type, (dist.world(),))
    decoder = decoder_of(model)
    layers = list(decoder.layers)
    for layer in layers:
        trained = {p for p in layer.parameters() if p.requires_grad}
        fully_shard(layer, mesh=mesh, reshard_after_forward=True, ignored_params=trained)
    # The decoder itself as the root unit: its own weights (embedding, norm) left whole, so it
    # only orders the layers' gathers (prefetch) and runs FSDP's lazy init once.
    own = {p for p in decoder.parameters()} - {p for layer in layers for p in layer.parameters()}
    trained = {p for p in decoder.parameters() if p.requires_grad}
    fully_shard(decoder, mesh=mesh, reshard_after_forward=True, ignored_params=own | trained)
    state = Sharding(decoder, layers, pad_id)

    def count(_module: Any, _args: Any) -> None:
        if not state.whole:
            state.calls.append(torch.is_grad_enabled())

    decoder.register_forward_pre_hook(count)
    setattr(model, ATTRIBUTE, state)
    return state


def sharding(model: Any) -> Sharding | None:
    state: Sharding | None = getattr(model, ATTRIBUTE, None)
    return state


def sharded_names(model: Any) -> list[str]:
    """Parameters held as shards (DTensors): the frozen base weights of the decoder layers."""
    from torch.distributed.tensor import DTensor

    return [n for n, p in model.named_parameters() if isinstance(p, DTensor)]


@contextmanager
def lockstep(model: Any, planned: int, grad: bool) -> Iterator[None]:
    """Run ``planned`` decoder passes (with backward if ``grad``) inside; ranks with fewer pad to the most.

    Every rank must enter at the same point. Leaving, a rank that ran a different number
    than it planned raises (its collectives are already out of step with the others').
    """
    state = sharding(model)
    if state is None:
        yield
        return
    most = int(dist.max_float(float(planned)))
    state.calls.clear()
    yield
    ran = list(state.calls)
    state.calls.clear()
    if len(ran) != planned or any(g != grad for g in ran):
        raise RuntimeError(
            f"rank {dist.rank()}: planned {planned} decoder passes (grad={grad}), ran {len(ran)} {ran}; "
            "the sharded ranks are out of step"
        )
    for _ in range(most - planned):
        _empty_pass(state, grad)
    state.calls.clear()


def _empty_pass(state: Sharding, grad: bool) -> None:
    """One decoder pass that changes nothing: it all-gathers what the others' real pass gathers."""
    ids = torch.full((1, 2), state.pad_id, dtype=torch.long, device=dist.device())
    with torch.set_grad_enabled(grad):
        hidden = state.decoder(input_ids=ids, use_cache=False).last_hidden_state
        if grad:
            (hidden.float().sum() * 0.0).backward()


@contextmanager
def gathered(model: Any) -> Iterator[None]:
    """Every layer gathered for the duration: passes inside issue no collectives (any number, any order).

    Every rank must enter and leave at the same point.
    """
    state = sharding(model)
    if state is None:
        yield
        return
    fsdp: list[Any] = [state.decoder, *state.layers]
    for m in fsdp:
        m.set_reshard_after_forward(False, recurse=False)
        m.set_reshard_after_backward(False, recurse=False)
    for m in state.layers:
        m.unshard()
    state.whole = True
    try:
        yield
    finally:
        state.whole = False
        for m in fsdp:
            m.set_reshard_after_forward(True, recurse=False)
            m.set_reshard_after_backward(True, recurse=False)
        for m in state.layers:
            m.reshard()
        if td.is_initialized():
            td.barrier()
