"""Text-feedback examples from the database, a few sessions at a time, rendered with the policy's own chat template.

:class:`TextFeed` is the SDPO/correction counterpart of :class:`storage.feed.TrainingFeed`:
the same incremental reader of the change log (:class:`storage.change_reader.ChangeReader`,
consumer ``text:<alias>``). A poll rebuilds the examples of the sessions that changed
since its cursor (a new call may bring hindsight, a new item a comment or a correction),
leaves out those already used (``used_feedback``), and keeps the rest waiting per session.
What the examples depend on besides the log is whether the project reads the next user turn
as feedback: turning it on or off starts the feed again from the beginning of the log.
The reward rule and the judge do not matter here (the judge's comments are never examples).
A part this run does not compute (``--sdpo-weight 0``, ``--correction-weight 0``) yields no
example: left out as ``text_weight_zero`` when its session is read, so it never takes a place
in a batch; like any example handed out and not used, it is read again only if its session
changes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from storage.change_reader import ChangeReader
from storage.changes import Position
from storage.judge_config import implicit_feedback, implicit_skip
from storage.loaders import settings_stmt
from storage.text_feedback import load_text_feedback
from storage.trajectories import chat_template_render
from trainer.textual import Objective, PromptRender, TextualExample, build_examples, hints

TEXT_WEIGHT_ZERO = "text_weight_zero"  # an exclusion: a text example whose part (--sdpo-weight …) is 0


def prompt_render(tokenizer: Any) -> PromptRender:
    """messages → token ids ending in the generation prompt (the teacher's context)."""

    def render(messages: list[dict[str, Any]]) -> list[int]:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    return render


@dataclass
class TextFeed(ChangeReader[TextualExample, tuple[bool, tuple[str, ...]]]):
    """``feed.poll(db) -> (examples, exclusions by reason)``: up to ``limit`` unused SDPO and correction examples."""

    alias: str
    tokenizer: Any = None
    max_len: int = 2048
    parts: frozenset[Objective] = field(default_factory=lambda: frozenset(("sdpo", "correction")))  # computed

    @property
    def consumer(self) -> str:
        return f"text:{self.alias}"

    def config(self, db: Session) -> tuple[bool, tuple[str, ...]]:
        """Whether hindsight (the next user turn) counts as feedback in this project, and which turns do not."""
        settings = db.scalar(settings_stmt(self.project))
        return implicit_feedback(settings), implicit_skip(settings)

    def read(
        self, db: Session, sessions: dict[str, Position], config: tuple[bool, tuple[str, ...]]
    ) -> tuple[dict[str, list[TextualExample]], Counter[str]]:
        """The unused examples of these sessions, by session, and every hint left out by reason."""
        loaded = load_text_feedback(db, self.project, self.alias, session_ids=list(sessions))
        items = hints(loaded.calls, loaded.grades, loaded.hindsight if config[0] else ())
        examples, excluded = build_examples(
            loaded.calls,
            items,
            prompt_render(self.tokenizer),
            chat_template_render(self.tokenizer),
            max_len=self.max_len,
            used=loaded.used,
        )
        by_session: dict[str, list[TextualExample]] = {}
        for example in examples:
            if example.objective not in self.parts:
                excluded[TEXT_WEIGHT_ZERO] += 1
                continue
            by_session.setdefault(example.student.session_id, []).append(example)
        return by_session, excluded
