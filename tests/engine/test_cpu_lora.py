"""The CPU LoRA ops: vLLM's numbers, one matmul per adapter, and no delta for base-model tokens."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points

import pytest
import torch
import vllm.lora.ops.torch_ops as package
import vllm.lora.ops.torch_ops.lora_ops as ops
import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

from engine import cpu_lora

NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
# vLLM's own ops, read before any test installs ours.
VLLM = {name: getattr(ops, name) for name in NAMES}
SGMV_SHRINK, SGMV_EXPAND = ops.sgmv_shrink, ops.sgmv_expand


@pytest.fixture
def installed() -> Iterator[None]:
    """Ours installed for one test, vLLM's put back after it."""
    saved = [(m, n, getattr(m, n)) for m in (ops, package, punica_cpu) for n in NAMES if hasattr(m, n)]
    cpu_lora.install()
    yield
    for module, name, value in saved:
        setattr(module, name, value)


def _weights(slots: int, out: int, inp: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(slots, 1, out, inp, generator=g).to(dtype)  # vLLM's stacked layout


def _tokens(n: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed)).to(dtype)


CASES = [
    pytest.param(torch.zeros(7, dtype=torch.long), id="one adapter"),
    pytest.param(torch.tensor([2, 0, 0, 1, 2, 2, 1]), id="three adapters interleaved"),
    pytest.param(torch.tensor([3]), id="one token"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("indices", CASES)
def test_shrink_and_expand_equal_vllms_ops(indices: torch.Tensor, dtype: torch.dtype) -> None:
    """Shrink (x Aᵀ · scale), expand (+= or =, wider adapter than model), expand into a slice."""
    n, hidden, rank, out = indices.shape[0], 48, 8, 40
    x = _tokens(n, hidden, dtype, 1)
    a, b = _weights(4, rank, hidden, dtype, 2), _weights(4, out + 3, rank, dtype, 3)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}

    want, got = torch.zeros(n, rank, dtype=dtype), torch.zeros(n, rank, dtype=dtype)
    VLLM["bgmv_shrink"](x, a, want, indices, 0.5)
    cpu_lora.bgmv_shrink(x, a, got, indices, 0.5)
    torch.testing.assert_close(got, want, **tol)
    assert got.abs().sum() > 0

    h = _tokens(n, rank, dtype, 4)
    for add in (True, False):
        base = _tokens(n, out, dtype, 5)
        want, got = base.clone(), base.clone()
        VLLM["bgmv_expand"](h, b, want, indices, add)
        cpu_lora.bgmv_expand(h, b, got, indices, add)
        torch.testing.assert_close(got, want, **tol)

        want, got = base.clone(), base.clone()
        VLLM["bgmv_expand_slice"](h, b[:, :, :16], want, indices, 10, 16, add)
        cpu_lora.bgmv_expand_slice(h, b[:, :, :16], got, indices, 10, 16, add)
        torch.testing.assert_close(got, want, **tol)
        assert not torch.equal(got[:, 10:26], base[:, 10:26]) and torch.equal(got[:, :10], base[:, :10])


def test_prefill_ops_go_through_ours_once_installed(installed: None) -> None:
    """sgmv_* (prefill: one slot per sequence, repeated over its tokens) call the installed bgmv_*."""
    assert punica_cpu.bgmv_shrink is cpu_lora.bgmv_shrink and ops.bgmv_expand is cpu_lora.bgmv_expand
    x, a = _tokens(9, 32, torch.float32, 6), _weights(3, 4, 32, torch.float32, 7)
    seq_lens, slots = torch.tensor([4, 5]), torch.tensor([1, 0])
    start = torch.tensor([0, 4])
    got = torch.zeros(9, 4)
    SGMV_SHRINK(x, a, got, start, seq_lens, slots, 2, 5, 9, 1.0)
    want = torch.cat([x[:4] @ a[1, 0].T, x[4:] @ a[0, 0].T])
    torch.testing.assert_close(got, want)
    h, b = _tokens(9, 4, torch.float32, 8), _weights(3, 32, 4, torch.float32, 9)
    out = torch.ones(9, 32)
    SGMV_EXPAND(h, b, out, start, seq_lens, slots, 2, 5, 9, True)
    torch.testing.assert_close(out, 1 + torch.cat([h[:4] @ b[1, 0].T, h[4:] @ b[0, 0].T]))


def test_a_token_without_an_adapter_gets_no_delta_even_when_every_slot_is_full() -> None:
    """Slot -1 is "no adapter": zero, not the last slot's adapter (what W[-1] would pick)."""
    indices = torch.tensor([0, -1, 3, -1])
    x = _tokens(4, 16, torch.float32, 10)
    a = _weights(4, 4, 16, torch.float32, 11)  # all four slots hold an adapter
    got = torch.full((4, 4), 9.0)
    cpu_lora.bgmv_shrink(x, a, got, indices, 1.0)
    assert torch.equal(got[1], torch.zeros(4)) and torch.equal(got[3], torch.zeros(4))
    torch.testing.assert_close(got[0], x[0] @ a[0, 0].T)
    torch.testing.assert_close(got[2], x[2] @ a[3, 0].T)
    out = torch.ones(4, 16)
    cpu_lora.bgmv_expand(got, _weights(4, 16, 4, torch.float32, 12), out, indices, True)
    assert torch.equal(out[1], torch.ones(16)) and not torch.equal(out[0], torch.ones(16))


def test_shapes_it_does_not_handle_go_to_vllms_op(installed: None) -> None:
    """One index for several rows (vLLM broadcasts it) is left to vLLM's own op."""
    x, a = _tokens(3, 8, torch.float32, 13), _weights(2, 4, 8, torch.float32, 14)
    assert cpu_lora.lora_delta(x, a, torch.tensor([1]), torch.float32) is None
    got, want = torch.zeros(3, 4), torch.zeros(3, 4)
    cpu_lora.bgmv_shrink(x, a, got, torch.tensor([1]), 1.0)
    VLLM["bgmv_shrink"](x, a, want, torch.tensor([1]), 1.0)
    torch.testing.assert_close(got, want)


def test_the_plugin_is_registered_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM finds it under its general-plugins group; ONTHEJOB_CPU_LORA=gather leaves vLLM's ops."""
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("onthejob_cpu_lora") == "engine.cpu_lora:register"
    monkeypatch.setenv(cpu_lora.ENV, "gather")
    before = [getattr(m, n) for m in (ops, punica_cpu) for n in NAMES]
    cpu_lora.register()
    assert [getattr(m, n) for m in (ops, punica_cpu) for n in NAMES] == before
