"""A project's judge settings (``settings["judge"]``): what the proxy validates and the judge and trainer read.

It lives in storage because three sides need the one definition: the admin API
checks it (``PUT /v1/admin/project``), ``onthejob judge`` runs by it, and the
reward rule gates judge grades by the calibration stored under its
:meth:`JudgeSettings.fingerprint`. Nothing here calls a model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from storage.grading import JUDGE_SOURCE, JUDGE_TAG, Exclusion

__all__ = ["JUDGE_SOURCE", "JUDGE_TAG"]  # defined beside the reward rule that ranks them
JUDGE_UNCALIBRATED = Exclusion.JUDGE_UNCALIBRATED  # a judge grade below the agreement gate
DEFAULT_MIN_AGREEMENT = 0.6
# Project setting (settings["implicit_feedback"], off by default): the next user turn of a multi-turn
# session counts as a comment on the assistant turn before it, for the judge and self-distillation.
IMPLICIT_FEEDBACK = "implicit_feedback"
# settings["implicit_feedback_skip"]: prefixes of user messages that are a tool's output in a harness's
# text protocol (the demo's "RESULT:"), never feedback; a role "tool" message never is either.
IMPLICIT_FEEDBACK_SKIP = "implicit_feedback_skip"


def implicit_feedback(settings: Mapping[str, Any] | None) -> bool:
    """Whether the project reads the next user turn as feedback (never instead of explicit feedback)."""
    return bool((settings or {}).get(IMPLICIT_FEEDBACK, False))


def implicit_skip(settings: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The prefixes of next user turns that are a tool's output, not feedback (the project's setting)."""
    skip = (settings or {}).get(IMPLICIT_FEEDBACK_SKIP) or ()
    return tuple(p for p in skip if isinstance(p, str) and p)


class JudgeSettingsError(ValueError):
    """Judge settings the API refuses; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class JudgeExample(BaseModel):
    """One worked example shown to a ``probability`` judge before the item: an input and whether it is good."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(min_length=1, max_length=2000, description="the item as the judge sees it: 'Answer: …'")
    good: bool


class JudgeSettings(BaseModel):
    """How a project's judge scores sessions; the defaults judge with the project's own served model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rubric: str = Field(min_length=1, max_length=8000, description="what a good answer is, in the operator's words")
    mode: Literal["absolute", "relative"] = "absolute"
    base_url: str | None = Field(
        default=None, max_length=500, description="OpenAI-compatible endpoint; None: this proxy (the served model)"
    )
    model: str | None = Field(default=None, max_length=200, description="model or alias; None: the project's alias")
    api_key_env: str | None = Field(default=None, max_length=200, description="environment variable with the key")
    scale: tuple[float, float] = (0.0, 1.0)  # the project's reward range a judge score is mapped into
    threshold: float | None = None  # decision threshold on that scale; None: the middle of it
    min_agreement: float = Field(default=DEFAULT_MIN_AGREEMENT, ge=-1.0, le=1.0)
    min_labelled: int = Field(default=8, ge=2, le=100_000)
    comments: bool = True  # judge sessions whose only feedback is a comment (reading the comment)
    self_evaluation: bool = False  # judge sessions nobody graded, from the conversation alone
    calibration_tags: tuple[str, ...] = ("calibration", "eval")  # graded sessions with these tags calibrate
    max_transcript_chars: int = Field(default=6000, ge=200, le=200_000)
    # How a score is read: "text" asks for a 'Score: N' line; "probability" asks for one word,
    # `labels[0]` (good) or `labels[1]` (bad), and reads P(good) / (P(good) + P(bad)) from the first
    # token's top log-probabilities (the endpoint must return logprobs). A small model that never
    # writes a score line can still rank sessions this way; calibration decides whether it may.
    readout: Literal["text", "probability"] = "text"
    labels: tuple[str, str] = ("positive", "negative")
    examples: tuple[JudgeExample, ...] = Field(default=(), max_length=32)

    @model_validator(mode="after")
    def _scale(self) -> JudgeSettings:
        low, high = self.scale
        if not high > low:
            raise ValueError(f"scale must be [low, high] with high > low, got {list(self.scale)}")
        if self.threshold is not None and not low <= self.threshold <= high:
            raise ValueError(f"threshold {self.threshold} is outside scale {list(self.scale)}")
        if self.readout == "probability" and self.mode != "absolute":
            raise ValueError("readout 'probability' scores one session at a time: use mode 'absolute'")
        good, bad = (label.strip().lower() for label in self.labels)
        if not good or not bad or good == bad:
            raise ValueError(f"labels must be two different words, got {list(self.labels)}")
        return self

    @property
    def decision_threshold(self) -> float:
        low, high = self.scale
        return self.threshold if self.threshold is not None else (low + high) / 2

    def fingerprint(self) -> str:
        """What calibration is keyed by: every field that changes a score (not the key, not the gate)."""
        scoring = {k: getattr(self, k) for k in ("rubric", "mode", "base_url", "model", "scale")}
        if self.readout != "text":  # only then: text-readout fingerprints stay what they were
            scoring |= {
                "readout": self.readout,
                "labels": self.labels,
                "examples": [e.model_dump() for e in self.examples],
            }
        blob = json.dumps(scoring, sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def parse_judge_settings(raw: Mapping[str, Any] | None) -> JudgeSettings | None:
    """``settings["judge"]`` validated, or None when the project has no judge; errors name the field."""
    if raw is None:
        return None
    try:
        return JudgeSettings.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        param = "judge." + ".".join(str(p) for p in err["loc"]) if err["loc"] else "judge"
        raise JudgeSettingsError(f"{param}: {str(err['msg']).removeprefix('Value error, ')}", param) from None


@dataclass(frozen=True)
class Verdict:
    """Whether a judge's grades may count, and why not (the gate both the judge and the reward rule apply)."""

    accepted: bool
    reason: str | None  # JUDGE_UNCALIBRATED when refused
    detail: str


def verdict(n: int | None, spearman: float | None, min_agreement: float, min_labelled: int) -> Verdict:
    """Grades count only with at least ``min_labelled`` scored pairs and rank agreement ρ ≥ ``min_agreement``."""
    if n is None or spearman is None:
        return Verdict(False, JUDGE_UNCALIBRATED, "never calibrated: run `onthejob judge --calibrate`")
    if n < min_labelled:
        return Verdict(False, JUDGE_UNCALIBRATED, f"{n} labelled pairs scored, {min_labelled} needed")
    if not spearman >= min_agreement:
        return Verdict(False, JUDGE_UNCALIBRATED, f"rank agreement {spearman:.2f} < {min_agreement:.2f}")
    return Verdict(True, None, f"rank agreement {spearman:.2f} >= {min_agreement:.2f} on {n} labelled sessions")
