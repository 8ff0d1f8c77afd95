"""Does the SDPO part drift when stepped again and again on the same comments? (issue 35)

``python -m bench.sdpo_drift [steps] [lr] [floor]`` trains the tiny model on a few hand-made
comment examples, one optimiser step at a time with the moments kept (a ``--watch`` run
without new data: the worst case for a self-teaching loop), once per configuration:

* ``live``: the teacher is the weights being stepped, unclipped, no KL (the old behaviour);
* ``guarded``: the defaults (frozen serving snapshot, log-ratio clip 2, KL 0.1);
* ``guarded+floor``: the same with ``--step-floor`` (AdamW's ε) set to ``floor``;
* ``+fresh``: a fresh AdamW every step, as the demo's one-step rounds with ``--fresh-optimizer``.

Per step it prints the mean teacher-student signal, its mean absolute value, the clipped
fraction, and KL(π_S ‖ serving) on the logged tokens (k3, measured the same way for both).
The tiny model has random weights: this measures drift, not whether answers get better.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import torch
from transformers import AutoTokenizer

from storage.trajectories import chat_template_render
from tests.storage.rows import choice, row
from trainer.batch import Example, collate, recorded_behaviour
from trainer.loop import _score
from trainer.objective import ObjectiveConfig
from trainer.policy import Policy, TrainConfig, build_optimizer, load_policy
from trainer.teacher import Teacher, attached
from trainer.textual import Hint, TextualExample, build_examples
from trainer.textual_step import textual_backward

PROBLEMS = [
    ("I had 9 apples and gave away 4. How many are left?", "ANSWER: 13", "Wrong: you added, subtract."),
    ("What is 7 times 6?", "ANSWER: 13", "No: multiply, do not add."),
    ("A box holds 12 eggs; 5 break. How many are whole?", "ANSWER: 17", "Subtract the broken ones."),
]


def examples(policy: Policy) -> list[TextualExample]:
    tok: Any = AutoTokenizer.from_pretrained(policy.info.path)

    def ids(messages: list[dict[str, Any]]) -> list[int]:
        out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    calls, hints = [], []
    for i, (q, answer, comment) in enumerate(PROBLEMS):
        msg = {"role": "user", "content": q}
        sampled = list(tok.encode(answer, add_special_tokens=False)) + [tok.eos_token_id]
        calls.append(
            SimpleNamespace(
                **row(
                    f"c{i}", ids([msg]), [choice(sampled, content=answer, logprobs=None)], messages=[msg], project="p"
                )
            )
        )
        hints.append(Hint(f"c{i}", f"f{i}", "comment", comment))
    made, _ = build_examples(calls, hints, ids, chat_template_render(tok))
    return made


def kl_to(policy: Policy, serving: Teacher, made: list[TextualExample]) -> float:
    b = collate([Example(e.student, 0.0, recorded_behaviour(e.student)) for e in made], policy.pad_id, policy.device)
    with torch.no_grad():
        logp = _score(policy, b)
        with serving.swapped(policy.model):
            ref = _score(policy, b)
    log_r = ((ref - logp) * b.mask).clamp(-20, 20)
    return float(((torch.exp(log_r) - 1 - log_r) * b.mask).sum() / b.mask.sum())


def run(mode: str, steps: int, lr: float, floor: float) -> None:
    cfg = TrainConfig(
        model="tiny",
        threads=1,
        lr=lr,
        objective=ObjectiveConfig(name="sdpo"),
        step_floor=floor if "floor" in mode else 0.0,
    )
    policy = load_policy(cfg)
    made = examples(policy)
    guard = attached(policy.model)
    assert guard is not None
    serving = Teacher({k: v.clone() for k, v in guard.weights.items()})  # for measuring only
    teacher = Teacher(guard.weights, "live", signal_clip=0.0, kl=0.0) if mode == "live" else guard
    print(f"{mode}: step  signal_mean  abs_signal  clipped  grad_rms  kl_serving")
    for step in range(1, steps + 1):
        policy.optimizer.zero_grad(set_to_none=True)
        sums = textual_backward(policy.model, policy.pad_id, policy.device, made, teacher=teacher)
        m = sums.metrics()
        for p in policy.parameters():
            if p.grad is not None:
                p.grad.div_(sums.tokens)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        if "fresh" in mode:
            policy.optimizer = build_optimizer(policy.parameters(), cfg)
        grads = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
        policy.optimizer.step()
        print(
            f"{mode}: {step:4d}  {m['sdpo_signal_mean']:+.4f}  {m['sdpo_abs_signal_mean']:.4f}  "
            f"{m['sdpo_clipped_frac'] or 0:.3f}  {float(grads.pow(2).mean().sqrt()):.2e}  "
            f"{kl_to(policy, serving, made):.4f}"
        )


def main(steps: int = 12, lr: float = 5e-3, floor: float = 1e-4) -> None:
    for mode in ("live", "guarded", "guarded+floor", "guarded+fresh", "guarded+fresh+floor"):
        torch.manual_seed(0)
        run(mode, steps, lr, floor)


if __name__ == "__main__":
    args = sys.argv[1:4]
    main(int(args[0]) if args else 12, *(float(a) for a in args[1:]))
