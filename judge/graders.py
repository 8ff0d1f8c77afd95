"""Graders for ``onthejob eval``: one reply and its eval item in, a score out (None: could not be graded).

``exact``, ``regex`` and ``numeric`` compare with the item's ``reference``; ``json-schema`` checks the
reply parses as JSON valid under the item's ``schema`` (or ``reference``); ``module:function`` calls
your own Python function with ``(item, reply)``. The project's judge (``judge``) is asynchronous and
lives in :mod:`judge.evaluate`.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
BUILTIN = ("exact", "regex", "numeric", "json-schema")


class GraderError(ValueError):
    """A grader that cannot be built, or an item it cannot grade; the message says which and why."""


@dataclass(frozen=True)
class EvalItem:
    """One eval prompt: chat messages (a ``prompt`` string becomes one user message) and what a reply should be."""

    id: str
    messages: list[dict[str, Any]]
    reference: Any = None
    schema: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: dict[str, Any], line: int) -> EvalItem:
        """An eval set line: ``{"id"?, "prompt" | "messages", "reference"?, "schema"?, ...}``."""
        if isinstance(obj.get("messages"), list) and obj["messages"]:
            messages = list(obj["messages"])
        elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
            messages = [{"role": "user", "content": obj["prompt"]}]
        else:
            raise GraderError(f"line {line}: give 'prompt' (text) or 'messages' (a non-empty list)")
        known = {"id", "prompt", "messages", "reference", "schema"}
        return cls(
            str(obj.get("id", line)),
            messages,
            obj.get("reference"),
            obj.get("schema"),
            {k: v for k, v in obj.items() if k not in known},
        )


Grader = Callable[[EvalItem, str], float | None]


def _need_reference(item: EvalItem, grader: str) -> Any:
    if item.reference is None:
        raise GraderError(f"item {item.id}: the {grader} grader needs a 'reference'")
    return item.reference


def exact(item: EvalItem, reply: str) -> float:
    """1 when the reply, stripped, is the reference (case-sensitive), else 0."""
    return float(reply.strip() == str(_need_reference(item, "exact")).strip())


def regex(item: EvalItem, reply: str) -> float:
    """1 when the reference pattern is found in the reply."""
    return float(re.search(str(_need_reference(item, "regex")), reply) is not None)


def numeric(item: EvalItem, reply: str, rel_tol: float = 1e-6) -> float:
    """1 when the reply's last number equals the reference number (relative tolerance 1e-6)."""
    want = float(_need_reference(item, "numeric"))
    found = NUMBER.findall(reply)
    if not found:
        return 0.0
    return float(math.isclose(float(found[-1].replace(",", "")), want, rel_tol=rel_tol, abs_tol=rel_tol))


def json_schema(item: EvalItem, reply: str) -> float:
    """1 when the reply (or its first ``{...}`` block) is JSON valid under the item's schema."""
    import jsonschema

    schema = item.schema if item.schema is not None else item.reference
    if not isinstance(schema, dict):
        raise GraderError(f"item {item.id}: the json-schema grader needs a 'schema' object")
    text = reply.strip()
    try:
        value = json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        try:
            value = json.loads(text[start : end + 1]) if 0 <= start < end else None
        except ValueError:
            return 0.0
        if value is None:
            return 0.0
    return float(jsonschema.Draft202012Validator(schema).is_valid(value))


def from_callable(spec: str) -> Grader:
    """``module:function``, imported now; it is called with ``(item, reply)`` and returns a number or None."""
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise GraderError(f"--grader {spec}: cannot import {name!r} from {module!r} ({exc})") from exc
    if not callable(fn):
        raise GraderError(f"--grader {spec}: {name!r} is not callable")

    def grade(item: EvalItem, reply: str) -> float | None:
        score = fn(item, reply)
        return None if score is None else float(score)

    return grade


def grader_for(spec: str) -> Grader:
    """The grader a ``--grader`` value names (not ``judge``: see :mod:`judge.evaluate`)."""
    table: dict[str, Grader] = {"exact": exact, "regex": regex, "numeric": numeric, "json-schema": json_schema}
    if spec in table:
        return table[spec]
    if ":" in spec:
        return from_callable(spec)
    raise GraderError(f"--grader {spec!r}: use exact, regex, numeric, json-schema, judge or module:function")
