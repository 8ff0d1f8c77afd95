"""Trajectory assembly: a session's linked calls → one token sequence with a sampling mask.

(Interface fixed here; assembly functions are filled in by the feedback/trajectories work.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One sampled segment of a trajectory: which call produced tokens [start, end)."""

    completion_id: str
    choice_index: int
    start: int
    end: int
    adapter_version: int | None  # None: the base model served it
    served_model: str
    # Effective sampling parameters of the call: {"temperature", "top_p", "top_k", ...}.
    sampling: dict[str, Any]


@dataclass
class Trajectory:
    """Token-exact training data for one branch of one session (see DESIGN.md)."""

    id: str
    project_id: str
    session_id: str
    task_id: str | None
    alias: str
    token_ids: list[int]
    mask: list[int]  # 1 only where the model sampled the token
    logprobs: list[float | None]  # behaviour logprobs aligned to token_ids; None where mask is 0 or missing
    turns: list[Turn]
    completion_ids: list[str]
    reward: float | None = None  # None: excluded from training (never treated as 0)
    reward_detail: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # e.g. "missing_logprobs", "truncated", "client_disconnected"
    tags: list[str] = field(default_factory=list)  # e.g. "eval": never trained on
    group: str | None = None  # task id, or "<completion_id>" for the n>1 choices of one call
    mismatches: int = 0  # re-rendered assistant tokens that differed from the sampled ids

    @property
    def adapters(self) -> list[int | None]:
        """Adapter version per turn."""
        return [t.adapter_version for t in self.turns]
