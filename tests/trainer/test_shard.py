"""Two gloo ranks with the base model sharded (FSDP2) compute what one process computes: TIS and SDPO steps."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("shard_step.py")
STEPS = (0, 1)  # 0: tis, 1: sdpo with text feedback


def free_port() -> int:
    """As tests.conftest's, here so that bench/gpu_check.py can import this module without the test stack."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(out: Path, world: int, *extra: str, torchrun: bool | None = None) -> subprocess.Popen[str]:
    """shard_step.py in a plain process (world 1) or under torchrun (``torchrun``, the default for world > 1).

    ``extra``: further outputs the same launch trains in turn (``skew:PATH`` for a skewed one).
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["OMP_NUM_THREADS"] = "1"
    launch = [sys.executable]
    if world > 1 or torchrun:
        launch += ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(world)]
        launch += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    cmd = [*launch, str(SCRIPT), str(out), *extra]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> None:
    """Wait for a :func:`start`\ ed launch; it must succeed."""
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]


def run(out: Path, world: int, *extra: str, torchrun: bool | None = None) -> None:
    """:func:`start` and :func:`finish`: one launch, waited for."""
    finish(start(out, world, *extra, torchrun=torchrun))


class Runs(NamedTuple):
    one: Path  # a plain process
    two: Path  # two sharded gloo ranks under torchrun
    alone: Path  # one sharded rank under torchrun (what one GPU allows)
    skew: Path  # two sharded ranks, rank 1 on other data (the same launch as ``two``)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Every launch the tests compare, in three launches of which two run side by side.

    Each launch spends most of its time importing torch and transformers, single-threaded: the
    plain process and the lone torchrun rank share the machine's two cores, then the two ranks
    train the equal run and the skewed one in turn (each from a freshly seeded policy).
    """
    tmp = tmp_path_factory.mktemp("shard")
    runs = Runs(tmp / "one", tmp / "two", tmp / "alone", tmp / "skew")
    side_by_side = [start(runs.one, 1), start(runs.alone, 1, torchrun=True)]
    for proc in side_by_side:
        finish(proc)
    run(runs.two, 2, f"skew:{runs.skew}")
    return runs


def _header(path: Path) -> dict[str, Any]:
    """A safetensors file's layout: every tensor's dtype, shape and byte offsets."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n])  # type: ignore[no-any-return]


def _config(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "adapter_config.json").read_text())
    config["target_modules"] = sorted(config["target_modules"])  # a set: its order varies per process
    return config  # type: ignore[no-any-return]


def differences(one: Path, two: Path) -> dict[str, float]:
    """The largest |one − two| of each step's loss, LoRA gradients and saved adapter tensors."""
    m1, m2 = json.loads(Path(f"{one}.json").read_text()), json.loads(Path(f"{two}.json").read_text())
    g1, g2 = load_file(f"{one}.grads.safetensors"), load_file(f"{two}.grads.safetensors")
    assert g1.keys() == g2.keys()
    out: dict[str, float] = {}
    for step in STEPS:
        out[f"loss{step}"] = abs(m1["steps"][step]["loss"] - m2["steps"][step]["loss"])
        keys = [k for k in g1 if k.startswith(f"{step}:")]
        out[f"grad{step}"] = max(float((g1[k] - g2[k]).abs().max()) for k in keys)
        a1, a2 = Path(f"{one}.adapter{step}"), Path(f"{two}.adapter{step}")
        w1, w2 = load_file(a1 / "adapter_model.safetensors"), load_file(a2 / "adapter_model.safetensors")
        assert w1.keys() == w2.keys()
        out[f"adapter{step}"] = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    return out


def assert_same_steps(one: Path, other: Path) -> None:
    """``other`` (sharded, under torchrun) computed what the plain process ``one`` computed, and saved it alike."""
    m1, m2 = json.loads(Path(f"{one}.json").read_text()), json.loads(Path(f"{other}.json").read_text())
    diffs = differences(one, other)
    print(f"max abs differences, one process vs {m2['world']} sharded rank(s):", diffs)
    g1 = load_file(f"{one}.grads.safetensors")
    for step in STEPS:
        s1, s2 = m1["steps"][step], m2["steps"][step]
        for key in ("tokens", "trajectories", "excluded", "recomputed_logprobs", "sdpo_tokens"):
            assert s1.get(key) == s2.get(key), (step, key)
        assert s1["tokens"] > 0
        scale = max(float(g1[k].abs().max()) for k in g1 if k.startswith(f"{step}:"))
        assert scale > 1e-6  # the step had a gradient to agree on
        assert diffs[f"loss{step}"] <= 1e-5 * max(1.0, abs(s1["loss"]))
        assert diffs[f"grad{step}"] <= 1e-5 * scale
        assert diffs[f"adapter{step}"] <= 1e-6
        for key in ("sdpo_loss", "sdpo_kl_serving", "ratio_mean", "kl_mu_pi"):
            if s1.get(key) is not None:
                assert s2[key] == pytest.approx(s1[key], rel=1e-4, abs=1e-7), (step, key)
    assert m1["steps"][1]["sdpo_tokens"] > 0  # the sdpo step trained on text feedback
    for step in STEPS:
        a1, a2 = Path(f"{one}.adapter{step}"), Path(f"{other}.adapter{step}")
        assert sorted(p.name for p in a1.iterdir()) == sorted(p.name for p in a2.iterdir())
        assert _config(a1) == _config(a2)
        # Saved once, whole: the same file layout (names, dtypes, shapes, offsets) vLLM loads from one process.
        assert _header(a1 / "adapter_model.safetensors") == _header(a2 / "adapter_model.safetensors")
        with safe_open(str(a2 / "adapter_model.safetensors"), "pt") as f:
            assert all("lora_" in k for k in f.keys())


@pytest.mark.slow
def test_two_sharded_gloo_ranks_match_one_process(runs: Runs) -> None:
    m1, m2 = json.loads(Path(f"{runs.one}.json").read_text()), json.loads(Path(f"{runs.two}.json").read_text())
    assert (m1["world"], m2["world"]) == (1, 2)
    assert m1["sharded"] == 0 and m2["sharded"] == 4 * 12  # every decoder layer's base weights, as DTensor shards
    assert_same_steps(runs.one, runs.two)
    r0, r1 = load_file(f"{runs.two}.rank0.safetensors"), load_file(f"{runs.two}.rank1.safetensors")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # both ranks took the same step, bit for bit


@pytest.mark.slow
def test_one_rank_under_torchrun_runs_the_sharded_path(runs: Runs) -> None:
    """A world of one (what one GPU allows) shards every layer over a mesh of one and computes the same."""
    m = json.loads(Path(f"{runs.alone}.json").read_text())
    assert (m["world"], m["sharded"]) == (1, 4 * 12)
    assert_same_steps(runs.one, runs.alone)


@pytest.mark.slow
def test_the_comparison_fails_when_a_rank_trains_on_other_data(runs: Runs) -> None:
    """The skewed run trained after the equal one in the same ranks: a fresh seeded policy, so only the data differ."""
    diffs = differences(runs.one, runs.skew)
    print("max abs differences, one process vs a rank on other data:", diffs)
    assert all(diffs[f"grad{step}"] > 1e-3 for step in STEPS)
    assert all(diffs[f"adapter{step}"] > 1e-4 for step in STEPS)
