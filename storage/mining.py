"""Failure modes of recorded calls (pure functions): what ``onthejob mine`` flags, and the per-project configuration.

Each detector reads one completion row (an ORM object or a dict with the columns of
``completions``) and says which modes it shows, with a detail (what matched). Grades
are read apart (:func:`grade_modes`): a feedback item flags the call it grades.

What is a failure is partly the project's business, so it is configuration
(``projects.settings["mine"]``, :class:`MineConfig`): the patterns a tool result
matches when the tool failed, the text protocol of a harness that calls tools by
writing lines (the demo's ``CALC:``: a line that looks like a tool line but does not
parse is flagged), a JSON schema replies must follow, the length of a long answer,
how many tool calls make a burst, refusal phrases and the grade below which a grade
is low. Nothing about any one harness is written here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from storage.trajectories import column

MODES = (
    "engine_error",  # the engine failed the call (upstream_error, HTTP 5xx)
    "tool_error",  # a tool result answering this call's tool call matched an error pattern
    "timeout",  # the proxy saw a timeout or disconnect, or the harness reported timeout/abort
    "truncated",  # finish_reason "length"
    "empty",  # no text and no tool call
    "repetition",  # degenerate output: a few token n-grams repeated over and over
    "tool_burst",  # more tool calls in one reply than the configured burst
    "refusal",
    "malformed_tool_call",  # arguments that are not JSON, or break the tool's schema
    "protocol_unparsed",  # a text-protocol tool line that does not parse
    "format_violation",  # a reply that is not JSON of the configured schema
    "long_answer",  # more completion tokens than the configured threshold
    "low_grade",  # a harness, human or judge grade below the threshold
)
KEYS = (
    "error_patterns",
    "tool_result_role",
    "tool_result_prefix",
    "protocol",
    "format_schema",
    "long_answer_tokens",
    "tool_burst",
    "refusals",
    "low_grade",
)
DEFAULT_REFUSALS = (r"\bI(?:'m| am) sorry,? but\b", r"\bI can(?:no|')t (?:help|assist) with\b", r"\bAs an AI\b")


@dataclass(frozen=True)
class MineConfig:
    """``settings["mine"]``: every key optional."""

    error_patterns: tuple[re.Pattern[str], ...] = (re.compile(r"(?i)^\s*(error|exception|traceback)\b"),)
    tool_result_role: str = "tool"  # the role of messages carrying tool results ("user" for a text protocol)
    tool_result_prefix: str = ""  # and the prefix that marks one (e.g. "RESULT:"), if the role is shared
    protocol_line: re.Pattern[str] | None = None  # a line that is meant as a tool call ...
    protocol_parse: re.Pattern[str] | None = None  # ... parses only if it matches this too
    format_schema: Mapping[str, Any] | None = None
    long_answer_tokens: int = 512
    tool_burst: int = 5
    refusals: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in DEFAULT_REFUSALS)
    low_grade: float = 0.5  # a scalar grade below this is low
    repetition_ngram: int = 4
    repetition_min_tokens: int = 32

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None) -> MineConfig:
        """The project's configuration; a bad regex or schema raises ValueError naming the key."""
        raw = dict((settings or {}).get("mine") or {})
        unknown = sorted(set(raw) - set(KEYS))
        if unknown:
            raise ValueError(f"mine.{unknown[0]} is not a setting; use {', '.join(KEYS)}")
        base = cls()

        def rx(key: str, value: Any) -> re.Pattern[str]:
            try:
                return re.compile(str(value), re.MULTILINE)
            except re.error as exc:
                raise ValueError(f"mine.{key}: {value!r} is not a regular expression ({exc})") from exc

        def num(key: str, kind: type[int] | type[float], default: float) -> Any:
            try:
                return kind(raw.get(key, default))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"mine.{key}: {raw[key]!r} is not a number") from exc

        protocol = raw.get("protocol") or {}
        schema = raw.get("format_schema")
        if schema is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"mine.format_schema: {exc.message}") from exc
        return cls(
            error_patterns=tuple(rx("error_patterns", p) for p in raw["error_patterns"])
            if "error_patterns" in raw
            else base.error_patterns,
            tool_result_role=str(raw.get("tool_result_role", base.tool_result_role)),
            tool_result_prefix=str(raw.get("tool_result_prefix", base.tool_result_prefix)),
            protocol_line=rx("protocol.line", protocol["line"]) if "line" in protocol else None,
            protocol_parse=rx("protocol.parse", protocol["parse"]) if "parse" in protocol else None,
            format_schema=schema,
            long_answer_tokens=num("long_answer_tokens", int, base.long_answer_tokens),
            tool_burst=num("tool_burst", int, base.tool_burst),
            refusals=tuple(rx("refusals", p) for p in raw["refusals"]) if "refusals" in raw else base.refusals,
            low_grade=num("low_grade", float, base.low_grade),
        )


Flags = dict[str, dict[str, Any]]  # mode -> detail


def _text(choice: Mapping[str, Any]) -> str:
    message = choice.get("message")
    if isinstance(message, Mapping):
        return str(message.get("content") or "")
    return str(choice.get("text") or "")


def _tool_calls(choice: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    return [c for c in calls or [] if isinstance(c, Mapping)]


def _degenerate(ids: Sequence[int], n: int, min_tokens: int) -> float | None:
    """The share of distinct n-grams when it is tiny (a loop), else None."""
    if len(ids) < min_tokens:
        return None
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    share = len(set(grams)) / len(grams)
    return share if share < 0.25 else None


def _tool_schemas(request: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tool in request.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name"):
            out[str(fn["name"])] = fn.get("parameters") or {}
    return out


def _bad_arguments(call: Mapping[str, Any], schemas: Mapping[str, Any]) -> str | None:
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "")
    except (TypeError, ValueError):
        return "arguments are not JSON"
    schema = schemas.get(str(fn.get("name")))
    if schema:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(args))
        if error is not None:
            return str(error.message)
    return None


def choice_modes(choice: Mapping[str, Any], request: Mapping[str, Any], cfg: MineConfig) -> Flags:
    """Modes one choice of a call shows by itself."""
    flags: Flags = {}
    text, calls, ids = _text(choice), _tool_calls(choice), choice.get("token_ids") or []
    if choice.get("finish_reason") == "length":
        flags["truncated"] = {}
    if not text.strip() and not calls:
        flags["empty"] = {}
    if (share := _degenerate(ids, cfg.repetition_ngram, cfg.repetition_min_tokens)) is not None:
        flags["repetition"] = {"distinct_ngram_share": round(share, 3)}
    if len(calls) > cfg.tool_burst:
        flags["tool_burst"] = {"tool_calls": len(calls)}
    if refusal := next((p.pattern for p in cfg.refusals if p.search(text)), None):
        flags["refusal"] = {"pattern": refusal}
    schemas = _tool_schemas(request)
    if bad := next(((c, why) for c in calls if (why := _bad_arguments(c, schemas))), None):
        flags["malformed_tool_call"] = {"tool": (bad[0].get("function") or {}).get("name"), "error": bad[1]}
    if cfg.protocol_line is not None:
        lines = [ln for ln in text.splitlines() if cfg.protocol_line.search(ln)]
        unparsed = [ln for ln in lines if cfg.protocol_parse is None or not cfg.protocol_parse.search(ln)]
        if unparsed:
            flags["protocol_unparsed"] = {"line": unparsed[0][:200]}
    if cfg.format_schema is not None and not calls:
        try:
            jsonschema.validate(json.loads(text), cfg.format_schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            flags["format_violation"] = {"error": getattr(exc, "message", "not JSON")[:200]}
    if len(ids) > cfg.long_answer_tokens:
        flags["long_answer"] = {"tokens": len(ids)}
    return flags


def call_modes(row: Any, cfg: MineConfig) -> Flags:
    """Modes of one completion: the union over its choices, and what its termination says."""
    flags: Flags = {}
    termination = column(row, "termination", "stop")
    if termination == "upstream_error" or (column(row, "status_code", 200) or 200) >= 500:
        flags["engine_error"] = {"termination": termination, "status": column(row, "status_code")}
    if termination in ("timeout", "client_disconnected"):
        flags["timeout"] = {"termination": termination}
    request = column(row, "request") or {}
    choices = column(row, "choices") or []
    for choice in choices:
        which = {"choice": choice.get("index")} if len(choices) > 1 else {}
        for mode, detail in choice_modes(choice, request, cfg).items():
            flags.setdefault(mode, {**detail, **which})
    return flags


def tool_errors(row: Any, cfg: MineConfig) -> list[str]:
    """Tool results new in this call's request (after the last assistant message) that match an error pattern.

    They answer the previous call's tool call, so the caller flags the parent.
    """
    messages = (column(row, "request") or {}).get("messages") or []
    last = max(
        (i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"), default=None
    )
    if last is None:
        return []
    out = []
    for m in messages[last + 1 :]:
        content = m.get("content") if isinstance(m, Mapping) else None
        if m.get("role") != cfg.tool_result_role or not isinstance(content, str):
            continue
        if cfg.tool_result_prefix and not content.startswith(cfg.tool_result_prefix):
            continue
        if any(p.search(content[len(cfg.tool_result_prefix) :].strip()) for p in cfg.error_patterns):
            out.append(content[:200])
    return out


def grade_modes(name: str, value: Any, scalar: float | None, cfg: MineConfig) -> Flags:
    """What one feedback item says: a reported timeout or abort, or a grade below the threshold."""
    if name == "outcome" and isinstance(value, str) and value.strip().lower() in ("timeout", "abort"):
        return {"timeout": {"reported": value.strip().lower()}}
    if scalar is not None and scalar < cfg.low_grade:
        return {"low_grade": {"name": name, "value": value, "scalar": scalar}}
    return {}


@dataclass
class Found:
    """Flags found in one pass, by completion id."""

    flags: dict[str, Flags] = field(default_factory=dict)

    def add(self, completion_id: str, modes: Flags) -> None:
        for mode, detail in modes.items():
            self.flags.setdefault(completion_id, {}).setdefault(mode, detail)
