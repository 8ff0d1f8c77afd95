"""Training memory against trajectory length: the chunked LM head against the unchunked one.

A Qwen2 built from a config (nothing downloaded; random weights): a 151,936-token vocabulary
(Qwen2's), 32,768 positions, small layers (hidden 64, 2 layers) so that the CPU can run 32k
tokens, wrapped in the trainer's LoRA. One trajectory per length, an eighth of its tokens sampled
(every 512 tokens, 448 of context then 64 sampled, as an agent session alternates tool output
and model turns),
scored under T 0.7 / top-k 50 / top-p 0.9 (the filters copy and threshold every row; a
full sort of 152k logits per row, top-p alone, costs minutes per length on two cores). Per length and path, in a fresh
process whose address space is capped (``--cap-gib``: a failed allocation is a clean
"out of memory", never the machine's OOM killer):

* total: one ``sequence_logprobs`` + TIS loss + backward, the process's peak resident memory
  above what it held before the step (``VmHWM``, reset through ``/proc/self/clear_refs``);
* head: the LM head, filters and selected log-probs alone (forward and backward) on hidden
  states (random: no decoder pass, so this runs at lengths whose whole step is too slow for
  the CPU, ``--total-max``), the same peak measure;
* tokens/s of the total step (on a shared machine: a floor).

``unchunked`` is the trainer's path before this change: the model's own head over every
needed column at once (``chunk_elements=0``). Lengths past its first failure are not run.

    .venv/bin/python -m bench.train_memory [--lengths 1024 2048 ...] [--cap-gib 6] \
        [--plot bench/results/train_memory.png] [--json bench/results/train_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VOCAB = 151_936
POSITIONS = 32_768
SAMPLING = {"temperature": 0.7, "top_k": 50, "top_p": 0.9}
TURN, SAMPLED = 512, 64  # every 512 tokens: 448 of context (prompt, tool output), then 64 sampled
MIB = 1 << 20


def _status(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> int:
    """Reset the resident high-water mark; the resident size now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def _model() -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.policy import TARGET_MODULES

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=POSITIONS,
        tie_word_embeddings=True,
        rope_theta=1e6,
        attn_implementation="sdpa",
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=list(TARGET_MODULES), task_type="CAUSAL_LM")
    model = get_peft_model(Qwen2ForCausalLM(config), lora)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    model.train()
    return model


def _inputs(length: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(0, VOCAB, (1, length), generator=gen)
    sampled = (torch.arange(length) % TURN >= TURN - SAMPLED).unsqueeze(0)
    full = torch.ones((1, length))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "score_mask": sampled,
        "temperature": full * SAMPLING["temperature"],
        "top_k": torch.full_like(ids, int(SAMPLING["top_k"])),
        "top_p": full * SAMPLING["top_p"],
        "min_p": full * 0.0,
    }


def _step(model: Any, inputs: dict[str, Any], chunked: bool) -> None:
    """One scoring forward/backward as the trainer does it (TIS loss, μ unknown: weight 1)."""
    import inspect

    import torch

    from trainer.logprobs import sequence_logprobs
    from trainer.objective import tis_loss

    CHUNK_ELEMENTS = getattr(sys.modules["trainer.logprobs"], "CHUNK_ELEMENTS", 0)  # noqa: N806

    kw: dict[str, Any] = {}
    if "chunk_elements" in inspect.signature(sequence_logprobs).parameters:
        kw["chunk_elements"] = CHUNK_ELEMENTS if chunked else 0
    elif chunked:
        raise SystemExit("this trainer has no chunked path")
    logp = sequence_logprobs(model, *inputs.values(), **kw).logprobs
    mask = inputs["score_mask"].float()
    mask[:, 0] = 0
    nan = torch.full_like(logp, float("nan"))
    loss = tis_loss(logp, logp.detach(), nan, mask, torch.ones(1), n_tokens=int(mask.sum()))
    loss.backward()


def _head_stage(model: Any, inputs: dict[str, Any], chunked: bool) -> int:
    """Peak bytes of the LM head, filters and selected log-probs (forward and backward) on hidden states.

    The states are random (the stage's memory does not depend on their values), so no decoder
    pass is needed and the stage can be measured at lengths whose whole step the CPU cannot run.
    """
    import torch

    from trainer.logprobs import token_logprobs

    head = model.get_base_model().get_output_embeddings()
    positions = inputs["score_mask"].clone()
    positions[:, 0] = False
    params = [inputs[k] for k in ("temperature", "top_k", "top_p", "min_p")]
    gen = torch.Generator().manual_seed(0)
    if chunked:
        from trainer.logprobs import head_logprobs

        rows, t = torch.nonzero(positions, as_tuple=True)
        states = torch.randn(rows.numel(), head.in_features, generator=gen).requires_grad_()
        ids = inputs["input_ids"][rows, t]
        before = _reset_peak()
        head_logprobs(head, states, ids, *(p[rows, t] for p in params)).sum().backward()
    else:  # what the unchunked path does after the decoder: the head over the columns, then the rows
        columns = torch.nonzero(positions.any(dim=0)).squeeze(1)
        states = torch.randn(1, columns.numel(), head.in_features, generator=gen).requires_grad_()
        before = _reset_peak()
        logits = head(states)
        rows, cols = torch.nonzero(positions[:, columns], as_tuple=True)
        t = columns[cols]
        token_logprobs(logits[rows, cols], inputs["input_ids"][rows, t], *(p[rows, t] for p in params)).sum().backward()
    return _status("VmHWM") - before


def worker(length: int, chunked: bool, cap_gib: float, threads: int, total: bool = True) -> dict[str, Any]:
    """Measure one (length, path) in this process (``total``: the whole step too, else the head stage only)."""
    import torch

    torch.set_num_threads(threads)
    model = _model()
    _step(model, _inputs(TURN), chunked)  # warm-up: threads, allocator, lazy initialisation
    model.zero_grad(set_to_none=True)
    # The cap: what the process maps now plus cap_gib (a failed allocation raises, the machine is spared).
    limit = _status("VmSize") + int(cap_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inputs = _inputs(length)
    out: dict[str, Any] = {"length": length, "path": "chunked" if chunked else "unchunked", "oom": False}
    try:
        if total:
            before = _reset_peak()
            started = time.perf_counter()
            _step(model, inputs, chunked)
            seconds = time.perf_counter() - started
            out.update(total_mib=(_status("VmHWM") - before) / MIB, seconds=seconds, tokens_per_s=length / seconds)
            model.zero_grad(set_to_none=True)
        out["head_mib"] = _head_stage(model, inputs, chunked) / MIB
    except (RuntimeError, MemoryError) as exc:  # torch's "can't allocate memory" under the cap
        out.update(oom=True, error=str(exc).splitlines()[0][:160])
    return out


def _run(length: int, chunked: bool, cap_gib: float, threads: int, total: bool) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}  # big blocks go back to the OS when freed
    argv = [
        sys.executable,
        "-m",
        "bench.train_memory",
        "--worker",
        str(length),
        "--cap-gib",
        str(cap_gib),
        "--threads",
        str(threads),
    ]
    argv += ([] if chunked else ["--unchunked"]) + ([] if total else ["--head-only"])
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:  # killed, or a crash outside the measured step
        return {
            "length": length,
            "path": "chunked" if chunked else "unchunked",
            "oom": True,
            "error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}",
        }
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _fit(rows: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    """Least-squares line through (thousands of tokens, MiB): slope (MiB per 1k tokens) and intercept."""
    pts = [(r["length"] / 1000, r[key]) for r in rows if not r["oom"] and key in r]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return slope, my - slope * mx


def _plot(rows: list[dict[str, Any]], cap_gib: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, style in (("chunked", "-"), ("unchunked", "--")):
        ok = [r for r in rows if r["path"] == name and not r["oom"]]
        whole = [r for r in ok if "total_mib" in r]
        ax.plot(
            [r["length"] for r in whole],
            [r["total_mib"] for r in whole],
            style,
            marker="o",
            label=f"{name}: whole step",
        )
        ax.plot(
            [r["length"] for r in ok], [r["head_mib"] for r in ok], style, marker="s", label=f"{name}: LM head stage"
        )
        failed = [r["length"] for r in rows if r["path"] == name and r["oom"]]
        if failed:
            ax.axvline(min(failed), color="firebrick", linestyle=":", label=f"{name}: out of memory at {min(failed)}")
    ax.axhline(cap_gib * 1024, color="grey", linewidth=1, label=f"cap {cap_gib:g} GiB")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("trajectory length (tokens, 1/8 sampled)")
    ax.set_ylabel("peak memory above the loaded model (MiB)")
    ax.set_title(f"Training memory, {VOCAB:,}-token vocabulary")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--paths", nargs="+", default=["chunked", "unchunked"], choices=["chunked", "unchunked"])
    ap.add_argument("--cap-gib", type=float, default=6.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--total-max", type=int, default=POSITIONS, help="longer lengths: the head stage only")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--head-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--unchunked", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        result = worker(args.worker, not args.unchunked, args.cap_gib, args.threads, total=not args.head_only)
        print(json.dumps(result), flush=True)
        return
    print(
        f"vocab {VOCAB:,}, {POSITIONS:,} positions, sampling {SAMPLING}, cap {args.cap_gib:g} GiB, "
        f"{args.threads} threads"
    )
    print(f"{'path':>9} {'tokens':>6} | {'total MiB':>9} {'head MiB':>8} {'tok/s':>7}")
    rows = []
    for path in args.paths:
        for length in sorted(args.lengths):
            r = _run(length, path == "chunked", args.cap_gib, args.threads, length <= args.total_max)
            rows.append(r)
            if r["oom"]:
                print(f"{path:>9} {length:>6} | out of memory under the cap ({r.get('error', '')})", flush=True)
                break
            total = f"{r['total_mib']:>9.0f}" if "total_mib" in r else f"{'-':>9}"
            speed = f"{r['tokens_per_s']:>7.0f}" if "tokens_per_s" in r else f"{'-':>7}"
            print(f"{path:>9} {length:>6} | {total} {r['head_mib']:>8.0f} {speed}", flush=True)
    for path in args.paths:
        mine = [r for r in rows if r["path"] == path]
        total, head = _fit(mine, "total_mib"), _fit(mine, "head_mib")
        if total is None or head is None:
            continue
        print(f"{path}: slope {total[0]:.1f} MiB per 1k tokens (whole step), {head[0]:.1f} (head stage)")
        if not any(r["oom"] for r in mine) and total[0] > 0:
            at = (args.cap_gib * 1024 - total[1]) / total[0] * 1000
            print(
                f"{path}: no failure measured; the line reaches the {args.cap_gib:g} GiB cap at ~{at:,.0f} tokens "
                f"(extrapolated)"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.plot:
        _plot(rows, args.cap_gib, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
