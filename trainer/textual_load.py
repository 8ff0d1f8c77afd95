"""One step's text-feedback examples from the database, rendered with the policy's own chat template."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy.orm import Session

from storage.text_feedback import load_text_feedback
from storage.trajectories import chat_template_render
from trainer.textual import PromptRender, TextualExample, build_examples, hints


def prompt_render(tokenizer: Any) -> PromptRender:
    """messages → token ids ending in the generation prompt (the teacher's context)."""

    def render(messages: list[dict[str, Any]]) -> list[int]:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    return render


def load_textual(
    db: Session, project: str, alias: str, tokenizer: Any, *, max_len: int, limit: int
) -> tuple[list[TextualExample], Counter[str]]:
    """Up to ``limit`` unused SDPO and correction examples of ``alias``, and what was left out by reason."""
    loaded = load_text_feedback(db, project, alias)
    items = hints(loaded.calls, loaded.grades, loaded.hindsight)
    examples, excluded = build_examples(
        loaded.calls, items, prompt_render(tokenizer), chat_template_render(tokenizer), max_len=max_len,
        used=loaded.used,
    )  # fmt: skip
    return examples[:limit], excluded
