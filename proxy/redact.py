"""Per-project redaction, applied to a record before it is written anywhere (spool, database).

Two policies, set per project (``PUT /v1/admin/project``):
``{"redact": {"store_text": false}}`` stores no text at all (every string in the
request, reply and captured choices becomes ``[redacted]``; token ids, logprobs,
usage and timings stay, so the record still trains); ``{"redact": {"patterns":
["sk-[A-Za-z0-9]+"]}}`` replaces matches of each regex everywhere they appear.

Feedback goes through the same policy (:func:`redact_feedback`): a customer's comment
or correction quotes the conversation it grades as readily as the conversation does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from proxy.redact_tokens import mask_logprob_entries, redact_choice
from storage.feedback_input import FeedbackIn
from storage.loaders import rule_for
from storage.models import Project

MASK = "[redacted]"
# Structural strings that carry no user text; kept so records stay readable.
KEEP_KEYS = frozenset(
    {
        "role",
        "model",
        "id",
        "object",
        "finish_reason",
        "type",
        "system_fingerprint",
        "tool_choice",
        "service_tier",
        "tool_call_id",
        "stop_reason",
    }
)
# Lists of numbers (ids, a captured choice's logprobs): nothing for a text policy to walk.
NUMBERS = frozenset({"token_ids", "prompt_token_ids", "logprobs"})
TEXT_FIELDS = ("request", "response", "choices", "error", "client_request", "client_response")


@dataclass(frozen=True)
class RedactionPolicy:
    store_text: bool = True
    patterns: tuple[re.Pattern[str], ...] = field(default_factory=tuple)

    @property
    def active(self) -> bool:
        return not self.store_text or bool(self.patterns)

    @classmethod
    def from_settings(cls, settings: dict[str, Any] | None) -> RedactionPolicy:
        redact = (settings or {}).get("redact") or {}
        return cls(
            store_text=bool(redact.get("store_text", True)),
            patterns=tuple(re.compile(p) for p in redact.get("patterns") or ()),
        )


def redact_record(record: dict[str, Any], policy: RedactionPolicy) -> dict[str, Any]:
    """A copy of ``record`` with every text-bearing field redacted under ``policy``.

    Patterns reach token ids too (:mod:`proxy.redact_tokens`): sampled ids that spell a
    match are masked, and a request that matched is stored without its prompt ids.
    Each captured choice's transient ``pieces`` (the engine's per-token logprob entries)
    are consumed here and never stored.
    """
    choices = record.get("choices") or ()
    if not policy.patterns:
        for choice in choices:
            choice.pop("pieces", None)
        if not policy.active:
            return record
    out = dict(record)
    masked: dict[int, list[int]] = {}
    if policy.patterns:
        choices = out["choices"] = [dict(c) for c in choices]  # the caller's dicts stay as they were
        for choice in choices:
            text = choice.get("text") if "text" in choice else _walk_text(choice.get("message"))
            positions = redact_choice(choice, policy.patterns, text)
            if positions:
                masked[int(choice.get("index", 0))] = positions
        if out.get("prompt_token_ids") is not None and _matches(out.get("request"), policy):
            out["prompt_token_ids"] = None
            for choice in choices:
                choice["redacted_prompt"] = True
    for name in TEXT_FIELDS:
        if out.get(name) is not None:
            out[name] = _walk(out[name], policy, key=None)
    for index, positions in masked.items():
        for name in ("response", "client_response"):
            mask_logprob_entries(out.get(name), index, positions)  # the walked copies, not the client's reply
    return out


def _walk_text(value: Any) -> str:
    """Every free-text string under ``value``, joined (what a pattern could match)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(_walk_text(v) for k, v in value.items() if k not in KEEP_KEYS)
    if isinstance(value, list):
        return "\n".join(_walk_text(v) for v in value)
    return ""


def _matches(value: Any, policy: RedactionPolicy) -> bool:
    text = _walk_text(value)
    return any(p.search(text) for p in policy.patterns)


def redact_text(text: str | None, policy: RedactionPolicy) -> str | None:
    """One free-text value (a feedback comment, say) under the same policy."""
    if text is None or not policy.active:
        return text
    return _walk(text, policy, key=None)  # type: ignore[no-any-return]


async def project_settings(db: AsyncSession, project: str) -> dict[str, Any]:
    """The project's settings as stored now (no project yet: none, so nothing asked for redaction)."""
    return dict(await db.scalar(select(Project.settings).where(Project.id == project)) or {})


def redact_feedback(items: Sequence[FeedbackIn], settings: dict[str, Any]) -> list[FeedbackIn]:
    """Feedback items with their free text redacted under the project's policy.

    Comment, correction and metadata like any text. A string value is a label: one the
    project's reward rule maps (``outcome: "success"``) is structural, like a role, and
    survives ``store_text: false``; any other label is text. Patterns apply to all of it.
    """
    policy = RedactionPolicy.from_settings(settings)
    if not policy.active:
        return list(items)
    labels = rule_for(settings).labels
    out = []
    for item in items:
        update: dict[str, Any] = {
            "comment": redact_text(item.comment, policy),
            "metadata": _walk(item.metadata, policy, key=None),
        }
        if isinstance(item.value, str):
            known = item.value in labels.get(item.name, {})
            update["value"] = _patterns(item.value, policy) if known else redact_text(item.value, policy)
        correction = getattr(item, "correction", None)
        if isinstance(correction, str):
            update["correction"] = redact_text(correction, policy)
        out.append(item.model_copy(update=update))
    return out


def _patterns(text: str, policy: RedactionPolicy) -> str:
    for pattern in policy.patterns:
        text = pattern.sub(MASK, text)
    return text


def _walk(value: Any, policy: RedactionPolicy, key: str | None) -> Any:
    if isinstance(value, str):
        if key in KEEP_KEYS:
            return value
        if not policy.store_text:
            return MASK
        return _patterns(value, policy)
    if isinstance(value, dict):
        return {k: _walk(v, policy, k) for k, v in value.items()}
    if isinstance(value, list):
        if key in NUMBERS:
            return value
        if key == "bytes" and not policy.store_text:
            return None  # the raw UTF-8 of each sampled token
        if key == "bytes" and policy.patterns:
            return None  # a pattern may straddle tokens; the bytes would spell it out
        return [_walk(v, policy, key) for v in value]
    return value
