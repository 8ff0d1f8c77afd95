"""SDPO and correction passes on the tiny model, its own chat template building the teacher's context."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from storage.trajectories import chat_template_render
from tests.storage.rows import choice, row
from trainer.batch import Example, collate
from trainer.loop import _score
from trainer.policy import Policy, TrainConfig, load_policy
from trainer.textual import Hint, TextualExample, build_examples
from trainer.textual_step import textual_backward

Q = {"role": "user", "content": "I had 9 apples and gave away 4. How many are left?"}


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(TrainConfig(model="tiny", threads=1, lr=1e-2))


@pytest.fixture(scope="module")
def tokenizer(policy: Policy) -> Any:
    return AutoTokenizer.from_pretrained(policy.info.path)


def _ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _examples(tokenizer: Any, kind: str, text: str) -> list[TextualExample]:
    sampled = list(tokenizer.encode("ANSWER: 13", add_special_tokens=False)) + [tokenizer.eos_token_id]
    c = SimpleNamespace(
        **row(
            "c1",
            _ids(tokenizer, [Q]),
            [choice(sampled, content="ANSWER: 13", logprobs=None)],
            messages=[Q],
            project="p",
        )
    )
    examples, excluded = build_examples(
        [c], [Hint("c1", "f1", kind, text)], lambda m: _ids(tokenizer, m), chat_template_render(tokenizer)
    )  # type: ignore[arg-type]
    assert not excluded
    return examples


def _grads(policy: Policy) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in policy.parameters()]


@pytest.mark.parametrize("form", ["token", "topk"])
def test_a_teacher_shown_nothing_new_gives_zero_gradient(policy: Policy, tokenizer: Any, form: str) -> None:
    (ex,) = _examples(tokenizer, "comment", "Wrong operation.")
    same = TextualExample("sdpo", ex.hint, ex.student, teacher=ex.student)  # the teacher's context = the student's
    policy.optimizer.zero_grad(set_to_none=True)
    sums = textual_backward(policy.model, policy.pad_id, policy.device, [same], form=form)  # type: ignore[arg-type]
    assert sums.sdpo_tokens == len(ex.student.token_ids) - sum(1 for m in ex.student.mask if not m)
    assert sums.sdpo_signal == 0.0
    assert all(float(g.abs().max()) <= 1e-7 for g in _grads(policy))


@pytest.mark.parametrize("form", ["token", "topk"])
def test_feedback_gives_a_finite_signal_and_a_gradient(policy: Policy, tokenizer: Any, form: str) -> None:
    (ex,) = _examples(tokenizer, "comment", "Wrong operation: you added instead of subtracting.")
    assert ex.teacher is not None and len(ex.teacher.token_ids) > len(ex.student.token_ids)
    policy.optimizer.zero_grad(set_to_none=True)
    sums = textual_backward(policy.model, policy.pad_id, policy.device, [ex], form=form)  # type: ignore[arg-type]
    metrics = sums.metrics()
    assert metrics["sdpo_tokens"] == sum(ex.student.mask) and metrics["correction_tokens"] == 0
    assert math.isfinite(metrics["sdpo_signal_mean"]) and metrics["sdpo_signal_mean"] != 0.0
    grads = _grads(policy)
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().max()) > 0 for g in grads)
    policy.optimizer.zero_grad(set_to_none=True)


def test_a_correction_step_raises_the_corrected_tokens(policy: Policy, tokenizer: Any) -> None:
    examples = _examples(tokenizer, "correction", "ANSWER: 5")
    (sft,) = [e for e in examples if e.objective == "correction"]
    batch = collate([Example(sft.student, 1.0, [math.nan] * len(sft.student.token_ids))], policy.pad_id, policy.device)
    with torch.no_grad():
        before = float(_score(policy, batch).sum())
    policy.optimizer.zero_grad(set_to_none=True)
    sums = textual_backward(policy.model, policy.pad_id, policy.device, examples, sdpo_weight=0.0)
    assert sums.correction_tokens == sum(sft.student.mask) and sums.sdpo_tokens > 0
    for p in policy.parameters():
        if p.grad is not None:
            p.grad.div_(sums.tokens)
    policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        after = float(_score(policy, batch).sum())
    assert after > before


def test_one_step_mixes_scored_text_and_correction_parts(policy: Policy, tokenizer: Any) -> None:
    import random

    from tests.trainer.helpers import make_trajectory, random_tokens
    from trainer.advantages import TaskBaseline
    from trainer.loop import train_step
    from trainer.objective import ObjectiveConfig

    rng = random.Random(3)
    scored = [
        make_trajectory(
            f"m{i}", random_tokens(rng, 8), random_tokens(rng, 4), reward=float(i % 2), logprobs=[None] * 4, group="g"
        )
        for i in range(4)
    ]
    textual = _examples(tokenizer, "correction", "ANSWER: 5")
    cfg = TrainConfig(model="tiny", threads=1, objective=ObjectiveConfig(name="sdpo", correction_weight=0.5))
    result = train_step(policy, scored, cfg, TaskBaseline(), textual=textual)
    m = result.metrics
    assert result.trained and m["tokens"] == 16 and m["loss"] is not None
    assert m["sdpo_tokens"] == sum(textual[0].student.mask) and m["correction_tokens"] > 0
    tis = train_step(policy, scored, TrainConfig(model="tiny", threads=1), TaskBaseline(), textual=textual)
    assert "sdpo_tokens" not in tis.metrics  # only --objective sdpo trains on text
