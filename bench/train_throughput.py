"""Training-step throughput: ``trainer.loop.train_step`` against a bare PEFT forward/backward loop.

Same model, same LoRA, same batch. The bare loop is what one would write with
plain transformers + PEFT: ``model(input_ids, labels=...)`` (cross-entropy on the
sampled tokens), ``backward``, ``AdamW.step``. The trainer's step adds
screening, advantages, collation, processed logprobs under each call's
sampling parameters, importance weights, rejection and the all-reduce
bookkeeping; it also asks the LM head only for the positions it scores
(``logits_to_keep``), which the bare loop cannot. Tokens/s counts every
non-padding token of the batch; the target is a ratio ≥ 0.9. On a shared
machine wall time swings with the neighbours' load, so the ratio of CPU
seconds (``time.process_time``, all threads of this process) is printed too.

Optionally (``--engine URL``, an engine serving the first model), the time
from "adapter saved" to the first response served by it: save, POST
``/v1/load_lora_adapter``, then a one-token chat call under the new name.

    .venv/bin/python bench/train_throughput.py [--models tiny default] [--batch 8] [--prompt 192] [--sampled 64]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from bench.samplings import SAMPLINGS
from storage.trajectories import Trajectory, Turn
from trainer.advantages import TaskBaseline
from trainer.batch import Example, collate, recorded_behaviour
from trainer.loop import _score, train_step
from trainer.policy import Policy, TrainConfig, load_policy


def make_batch(policy: Policy, n: int, prompt: int, sampled: int, sampling: dict[str, float]) -> list[Trajectory]:
    """Random token trajectories with on-policy μ (so nothing is rejected)."""
    rng = random.Random(0)
    vocab = int(policy.model.config.vocab_size)
    out = []
    for i in range(n):
        ids = [rng.randrange(vocab) for _ in range(prompt + sampled)]
        turn = Turn(f"c{i}", 0, prompt, prompt + sampled, None, "m", dict(sampling))
        out.append(
            Trajectory(
                id=f"t{i}",
                project_id="p",
                session_id=f"s{i}",
                task_id="task",
                alias="a",
                token_ids=ids,
                mask=[0] * prompt + [1] * sampled,
                logprobs=[None] * (prompt + sampled),
                turns=[turn],
                completion_ids=[turn.completion_id],
                reward=float(i % 2),
                group="g",
            )
        )
    batch = collate([Example(t, 0.0, recorded_behaviour(t)) for t in out], policy.pad_id, policy.device)
    with torch.no_grad():
        lp = _score(policy, batch)
    for row, t in enumerate(out):
        t.logprobs = [float(lp[row, j]) if t.mask[j] else None for j in range(len(t.token_ids))]
    return out


def trainer_step(policy: Policy, batch: list[Trajectory], cfg: TrainConfig) -> tuple[float, float]:
    """Wall and CPU seconds for one ``train_step``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = train_step(policy, batch, cfg, TaskBaseline())
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    assert result.trained, result.metrics
    return elapsed


def bare_step(policy: Policy, batch: list[Trajectory], opt: torch.optim.Optimizer) -> tuple[float, float]:
    """Wall and CPU seconds for one plain PEFT step: forward with labels, backward, AdamW."""
    model = policy.model
    ids = torch.tensor([t.token_ids for t in batch], device=policy.device)
    labels = torch.tensor(
        [[tok if m else -100 for tok, m in zip(t.token_ids, t.mask, strict=True)] for t in batch], device=policy.device
    )
    wall, cpu = time.perf_counter(), time.process_time()
    model.train()
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    loss.backward()
    opt.step()
    return time.perf_counter() - wall, time.process_time() - cpu


def saved_to_served(policy: Policy, engine: str, alias: str) -> float:
    """Seconds from the adapter on disk to the first token served under its name."""
    import httpx

    from trainer.publish import adapter_dir, save_adapter

    root = Path(tempfile.mkdtemp(prefix="otj-bench-"))
    name = f"{alias}@v{int(time.time())}"
    folder = save_adapter(policy.model, adapter_dir(root, "bench", alias, 1))
    started = time.perf_counter()
    with httpx.Client(timeout=60) as http:
        r = http.post(f"{engine}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)})
        r.raise_for_status()
        r = http.post(
            f"{engine}/v1/chat/completions",
            json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        )
        r.raise_for_status()
    return time.perf_counter() - started


def _label(sampling: dict[str, float]) -> str:
    names = {"temperature": "T", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p"}
    return " ".join(f"{names[k]} {v:g}" for k, v in sampling.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "default"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=192)
    ap.add_argument("--sampled", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default=None, help="engine URL serving the first model: also time saved → served")
    args = ap.parse_args()
    tokens = args.batch * (args.prompt + args.sampled)
    print(
        f"batch: {args.batch} × ({args.prompt} prompt + {args.sampled} sampled) = {tokens} tokens, "
        f"{args.threads} threads, best of {args.repeats} interleaved"
    )
    print(f"{'model':>8} {'sampling':>30} | {'trainer tok/s':>13} {'bare tok/s':>11} {'ratio':>6} {'cpu ratio':>9}")
    # bench/gpu_check.py's four sampling settings, each against the same bare loop.
    settings = [(_label(s), s) for s in SAMPLINGS]
    for spec in args.models:
        # lr 0: the weights (and so the recorded μ) stay put, the work per step is the same.
        cfg = TrainConfig(model=spec, threads=args.threads, micro_tokens=tokens, lr=0.0)
        policy = load_policy(cfg)
        opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=0.0)
        batches = {label: make_batch(policy, args.batch, args.prompt, args.sampled, s) for label, s in settings}
        times: dict[str, list[tuple[float, float]]] = {label: [] for label in (*batches, "bare")}
        # Interleaved and warmed up, best of N: other processes share these cores.
        for i in range(args.repeats + 1):
            for label, batch in batches.items():
                elapsed = trainer_step(policy, batch, cfg)
                if i:
                    times[label].append(elapsed)
            elapsed = bare_step(policy, batches[settings[0][0]], opt)
            if i:
                times["bare"].append(elapsed)
        bare_wall, bare_cpu = (min(x[i] for x in times["bare"]) for i in (0, 1))
        for label in batches:
            wall, cpu = (min(x[i] for x in times[label]) for i in (0, 1))
            print(
                f"{spec:>8} {label:>30} | {tokens / wall:>13,.0f} {tokens / bare_wall:>11,.0f} "
                f"{bare_wall / wall:>6.2f} {bare_cpu / cpu:>9.2f}",
                flush=True,
            )
        if args.engine and spec == args.models[0]:
            print(f"saved → first response on {args.engine}: {saved_to_served(policy, args.engine, 'bench'):.3f} s")


if __name__ == "__main__":
    main()
