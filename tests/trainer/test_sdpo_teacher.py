"""The SDPO teacher (issue 35): a frozen snapshot of the serving weights, never the weights being stepped.

Hand-built logits first (a module whose one trainable tensor *is* the logits), then the
tiny model through :func:`trainer.textual_step.textual_backward`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from storage.trajectories import chat_template_render
from tests.storage.rows import choice, row
from trainer.objective import ObjectiveConfig
from trainer.policy import Policy, TrainConfig, load_policy
from trainer.settings import TrainSettings
from trainer.teacher import Teacher, attached
from trainer.textual import Hint, TextualExample, build_examples
from trainer.textual_step import textual_backward


class Logits(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lora = torch.nn.Parameter(torch.tensor([0.5, 0.1, 1.0, -1.0]))
        self.register_buffer("base", torch.zeros(4))  # not trainable: never snapshotted


def _step(m: Logits, by: float) -> None:
    with torch.no_grad():
        m.lora.add_(by)


@pytest.mark.parametrize("mode", ["frozen", "ema", "live"])
def test_the_teacher_sees_the_snapshot_while_the_student_steps(mode: str) -> None:
    m = Logits()
    serving = m.lora.detach().clone()
    teacher = Teacher.of(m, mode)  # type: ignore[arg-type]
    assert teacher.bytes() == 4 * 4  # one copy of the trainable tensor, nothing else
    _step(m, 1.0)
    m.lora.grad = torch.ones(4)
    teacher.update(m)
    with teacher.teaching(m):
        seen = m.lora.detach().clone()
    expected = {"frozen": serving, "ema": serving + 0.05, "live": serving + 1.0}[mode]
    torch.testing.assert_close(seen, expected)
    torch.testing.assert_close(m.lora.detach(), serving + 1.0)  # the trained weights are back
    assert m.lora.grad is not None and bool((m.lora.grad == 1).all())  # and so is their gradient
    assert teacher.moved(m)


def test_an_unmoved_student_is_the_serving_version() -> None:
    m = Logits()
    teacher = Teacher.of(m)
    assert not teacher.moved(m)
    teacher.update(m)  # frozen: nothing
    _step(m, 0.5)
    assert teacher.moved(m)


def test_the_settings_reach_the_teacher() -> None:
    s = TrainSettings(
        alias="a",
        database_url="postgresql://x",
        objective="sdpo",
        sdpo_teacher="ema",
        sdpo_ema=0.1,
        sdpo_signal_clip=1.5,
        sdpo_kl=0.2,
        step_floor=1e-4,
    )
    obj = s.train_config().objective
    assert (obj.sdpo_teacher, obj.sdpo_ema, obj.sdpo_signal_clip, obj.sdpo_kl) == ("ema", 0.1, 1.5, 0.2)
    assert s.train_config().step_floor == 1e-4
    from trainer.settings import SettingsError

    with pytest.raises(SettingsError, match="--sdpo-teacher"):
        TrainSettings(alias="a", database_url="postgresql://x", sdpo_teacher="student")
    with pytest.raises(SettingsError, match="--sdpo-kl"):
        TrainSettings(alias="a", database_url="postgresql://x", sdpo_kl=-1.0)


# --------------------------------------------------------------------------- the tiny model

Q = {"role": "user", "content": "I had 9 apples and gave away 4. How many are left?"}


@pytest.fixture(scope="module")
def policy() -> Policy:
    cfg = TrainConfig(model="tiny", threads=1, lr=1e-2, objective=ObjectiveConfig(name="sdpo", sdpo_kl=0.0))
    return load_policy(cfg)


@pytest.fixture(scope="module")
def example(policy: Policy) -> TextualExample:
    tok = AutoTokenizer.from_pretrained(policy.info.path)

    def ids(messages: list[dict[str, Any]]) -> list[int]:
        out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    sampled = list(tok.encode("ANSWER: 13", add_special_tokens=False)) + [tok.eos_token_id]
    c = SimpleNamespace(
        **row("c1", ids([Q]), [choice(sampled, content="ANSWER: 13", logprobs=None)], messages=[Q], project="p")
    )
    examples, _ = build_examples([c], [Hint("c1", "f1", "comment", "Wrong.")], ids, chat_template_render(tok))  # type: ignore[arg-type]
    (ex,) = examples
    return TextualExample("sdpo", ex.hint, ex.student, teacher=ex.student)  # the teacher's context = the student's


def _grad_norm(policy: Policy) -> float:
    return float(sum(float(p.grad.abs().sum()) for p in policy.parameters() if p.grad is not None))


def _move(policy: Policy) -> None:
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))


def test_an_sdpo_policy_carries_a_frozen_teacher_that_publishing_leaves_out(policy: Policy, tmp_path: Path) -> None:
    teacher = attached(policy.model)
    assert teacher is not None and teacher.mode == "frozen"
    assert teacher.bytes() == sum(p.numel() * p.element_size() for p in policy.parameters())
    policy.model.save_pretrained(str(tmp_path))
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    tis = load_policy(TrainConfig(model="tiny", threads=1))
    assert attached(tis.model) is None


def test_after_the_weights_move_the_frozen_teacher_still_teaches_the_serving_version(
    policy: Policy, example: TextualExample
) -> None:
    """Same context for both: a live teacher (the stepped weights) gives exactly no signal, the frozen one does."""
    teacher = attached(policy.model)
    assert teacher is not None
    torch.manual_seed(0)
    _move(policy)
    live = Teacher(teacher.weights, "live", signal_clip=0.0, kl=0.0)
    policy.optimizer.zero_grad(set_to_none=True)
    sums = textual_backward(policy.model, policy.pad_id, policy.device, [example], teacher=live)
    assert sums.sdpo_signal == 0.0 and _grad_norm(policy) == 0.0
    policy.optimizer.zero_grad(set_to_none=True)
    sums = textual_backward(policy.model, policy.pad_id, policy.device, [example])  # the attached, frozen one
    assert sums.sdpo_abs_signal > 0 and _grad_norm(policy) > 0
    # its pull is back towards the serving weights: one small step against the gradient lowers the distance
    with torch.no_grad():
        params = dict((n, p) for n, p in policy.model.named_parameters() if p.requires_grad)
        before = sum(float((params[n] - w).pow(2).sum()) for n, w in teacher.weights.items())
        for p in params.values():
            assert p.grad is not None
            p.sub_(1e-3 * p.grad / max(_grad_norm(policy), 1e-12))
        after = sum(float((params[n] - w).pow(2).sum()) for n, w in teacher.weights.items())
    policy.optimizer.zero_grad(set_to_none=True)
    assert after < before


def test_the_kl_to_serving_is_measured_and_skipped_while_the_weights_are_unmoved(
    policy: Policy, example: TextualExample
) -> None:
    teacher = attached(policy.model)
    assert teacher is not None
    fresh = Teacher.of(policy.model, kl=1.0)  # a snapshot of the weights as they are now
    policy.optimizer.zero_grad(set_to_none=True)
    assert textual_backward(policy.model, policy.pad_id, policy.device, [example], teacher=fresh).sdpo_kl == 0.0
    anchored = Teacher(teacher.weights, kl=1.0)  # the snapshot from before the weights moved
    sums = textual_backward(policy.model, policy.pad_id, policy.device, [example], teacher=anchored)
    assert sums.sdpo_kl > 0 and sums.metrics()["sdpo_kl_serving"] > 0
    policy.optimizer.zero_grad(set_to_none=True)
