"""Feedback as the API takes it: one item or a batch, validated, each refusal naming its field.

Kept apart from storing (:mod:`storage.feedback`): nothing here touches the database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.config import JsonDict

from storage.models import NO_NUL

MAX_COMMENT_BYTES = 16 * 1024
MAX_METADATA_BYTES = 16 * 1024
MAX_LABEL_CHARS = 1000
MAX_BATCH = 1000
# The spec states lengths in characters; a comment of this many characters fits the byte limit
# whatever they are (4 bytes each at most in UTF-8), so everything the spec allows is accepted.
COMMENT_CHARS = MAX_COMMENT_BYTES // 4
NON_BLANK = r"^[^\x00]*[^\s\x00][^\x00]*$"
_ID: JsonDict = {"pattern": NO_NUL}
TARGET_KINDS = ("completion_id", "session_id", "client_request_id")
FIELDS = ("target", "name", "value", "comment", "source", "id", "metadata")

CORRECTION = "correction"  # the feedback kind whose comment is the corrected answer (docs/learning.md)


class FeedbackInputError(ValueError):
    """Feedback the API refuses; ``param`` names the field, the message says the fix."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class FeedbackConflict(FeedbackInputError):
    """An idempotency key reused for different feedback."""


# --------------------------------------------------------------------------- input


class FeedbackTarget(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [  # one id; choice only beside a call's
                {
                    "required": ["completion_id"],
                    "not": {"anyOf": [{"required": ["session_id"]}, {"required": ["client_request_id"]}]},
                },
                {
                    "required": ["client_request_id"],
                    "not": {"anyOf": [{"required": ["session_id"]}, {"required": ["completion_id"]}]},
                },
                {
                    "required": ["session_id"],
                    "not": {
                        "anyOf": [
                            {"required": ["completion_id"]},
                            {"required": ["client_request_id"]},
                            {"required": ["choice"]},
                        ]
                    },
                },
            ]
        },
    )

    completion_id: str | None = Field(default=None, min_length=1, max_length=200, json_schema_extra=_ID)
    session_id: str | None = Field(default=None, min_length=1, max_length=200, json_schema_extra=_ID)
    client_request_id: str | None = Field(default=None, min_length=1, max_length=200, json_schema_extra=_ID)
    # One choice of an n > 1 call (its index); None: the whole call. Preference pairs need it.
    choice: int | None = Field(default=None, ge=0, le=1023)

    @field_validator("choice", mode="before")
    @classmethod
    def _choice_is_a_number(cls, v: Any) -> Any:
        if isinstance(v, bool | str):  # JSON's 2 and 2.0 are one integer; true and "2" are no index
            raise ValueError("target.choice is the index of a choice: a whole number such as 0 or 1")
        return v

    @field_validator("completion_id", "session_id", "client_request_id")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("contains a NUL character (\\u0000); no such id exists")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> FeedbackTarget:
        given = [k for k in TARGET_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of target.completion_id (the x-request-id of the call), "
                f"target.session_id or target.client_request_id; got {len(given)}"
            )
        if self.choice is not None and self.session_id is not None:
            raise ValueError(
                "target.choice names one choice of a call: give it with completion_id or client_request_id"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in TARGET_KINDS if getattr(self, k) is not None)

    @property
    def id(self) -> str:
        return str(getattr(self, self.kind))


class FeedbackIn(BaseModel):
    """One feedback item as posted; a value, a comment, or both."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"anyOf": [{"required": ["value"]}, {"required": ["comment"]}]}
    )

    target: FeedbackTarget
    name: str = Field(min_length=1, max_length=200, json_schema_extra=_ID)
    value: Any = Field(
        default=None,
        json_schema_extra={
            "anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "string", "maxLength": MAX_LABEL_CHARS}]
        },
    )
    comment: str | None = Field(default=None, json_schema_extra={"maxLength": COMMENT_CHARS, "pattern": NON_BLANK})
    source: str = Field(default="", max_length=200, json_schema_extra=_ID)
    id: str | None = Field(default=None, min_length=1, max_length=200, json_schema_extra=_ID)  # idempotency key
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("value")
    @classmethod
    def _value_type(cls, v: Any) -> Any:
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int | float):
            if not math.isfinite(v):
                raise ValueError("value must be a finite number")
            if isinstance(v, int) and abs(v) >= 2**63:
                raise ValueError("value is too large: integers must fit in 64 bits")
            return v
        if isinstance(v, str):
            if len(v) > MAX_LABEL_CHARS:
                raise ValueError(
                    f"a string value is a label of at most {MAX_LABEL_CHARS} characters; put text in comment"
                )  # noqa: E501
            return v
        raise ValueError(
            f"value must be a number, a boolean or a string label, not {type(v).__name__}; "
            "put structured data in metadata"
        )

    @field_validator("comment")
    @classmethod
    def _comment_size(cls, v: str | None) -> str | None:
        if v is not None and len(v.encode()) > MAX_COMMENT_BYTES:
            raise ValueError(
                f"comment is {len(v.encode())} bytes, over the {MAX_COMMENT_BYTES}-byte limit; "
                "shorten it or store the full text elsewhere and link it in metadata"
            )
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(v, default=str).encode()) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is over {MAX_METADATA_BYTES} bytes as JSON; keep it small")
        return v

    @field_validator("name", "comment", "source", "id")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("contains a NUL character (\\u0000), which cannot be stored; remove it")
        return v

    @model_validator(mode="after")
    def _value_or_comment(self) -> FeedbackIn:
        if self.name == CORRECTION and (self.value is not None or not (self.comment and self.comment.strip())):
            # A correction is text the answer should have been: it trains by SFT and self-distillation,
            # never as a scalar, so a value would be silently meaningless.
            raise ValueError('a correction is the corrected answer in "comment" and has no "value"')
        if self.value is None and not (self.comment and self.comment.strip()):
            raise ValueError('give a value (number, boolean or label), a comment, or both, e.g. "value": true')
        return self


def _param(loc: Sequence[int | str], prefix: str) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _explain(err: Any, prefix: str) -> FeedbackInputError:
    loc = list(err["loc"]) or ["value"]  # the item-level check (value or comment) reports on value
    kind, field = err["type"], str(loc[-1]) if loc else ""
    param = _param(loc, prefix) or None
    where = param or "feedback"
    if kind == "extra_forbidden":
        allowed = ", ".join(TARGET_KINDS) if len(loc) >= 2 and loc[-2] == "target" else ", ".join(FIELDS)
        return FeedbackInputError(f"{where} is not a known field; use one of {allowed}", param)
    if kind == "missing" and field == "target":
        return FeedbackInputError(f'{where} is required, e.g. {{"completion_id": "<x-request-id of the call>"}}', param)
    if kind == "missing" and field == "name":
        return FeedbackInputError(f'{where} is required, e.g. "reward", "thumbs", "outcome" or "comment"', param)
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return FeedbackInputError(f"{where} must be a JSON object", param)
    if kind.startswith("string_too"):
        return FeedbackInputError(f"{where}: {err['msg'].lower()}", param)
    if kind == "string_type":
        return FeedbackInputError(f"{where} must be a string", param)
    msg = str(err["msg"]).removeprefix("Value error, ")
    return FeedbackInputError(f"{where}: {msg}", param)


def parse_feedback(body: Any) -> tuple[list[FeedbackIn], bool]:
    """Validate one item, ``{"feedback": [...]}`` or a JSON list; returns (items, is_batch).

    Every item is validated before anything is stored: one bad item refuses the batch.
    """
    if isinstance(body, dict) and "feedback" in body and "target" not in body:
        raw, batch, prefix = body["feedback"], True, "feedback"
        if not isinstance(raw, list):
            raise FeedbackInputError("feedback must be a list of feedback items", "feedback")
    elif isinstance(body, list):
        raw, batch, prefix = body, True, "feedback"
    elif isinstance(body, dict):
        raw, batch, prefix = [body], False, ""
    else:
        raise FeedbackInputError('the body must be a feedback object, {"feedback": [...]} or a JSON list', None)
    if batch and not raw:
        raise FeedbackInputError("feedback: the batch is empty; send at least one item", "feedback")
    if len(raw) > MAX_BATCH:
        raise FeedbackInputError(f"feedback: {len(raw)} items, over {MAX_BATCH} a batch; split it", "feedback")
    items: list[FeedbackIn] = []
    for i, item in enumerate(raw):
        where = f"{prefix}[{i}]" if batch else ""
        if not isinstance(item, dict):
            raise FeedbackInputError(f"{where or 'the body'} must be a feedback object", where or None)
        try:
            items.append(FeedbackIn.model_validate(item))
        except ValidationError as exc:
            raise _explain(exc.errors()[0], where) from None
    return items, batch


# --------------------------------------------------------------------------- the API spec


def openapi_schema() -> dict[str, Any]:
    """``POST /v1/feedback``'s request body schema, generated from :class:`FeedbackIn` (one item,
    a list, or ``{"feedback": [...]}``), so the spec and the validator cannot disagree."""
    item = _spec(FeedbackIn.model_json_schema())
    batch = {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": item}
    wrapped = {
        "type": "object",
        "required": ["feedback"],
        "additionalProperties": False,
        "properties": {"feedback": batch},
    }
    return {"anyOf": [item, batch, wrapped]}


def _spec(schema: dict[str, Any]) -> dict[str, Any]:
    """Nested models inlined; an optional field documented as what to send (its type, not null)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return walk(dict(defs[node["$ref"].rsplit("/", 1)[-1]]))
        node = {k: walk(v) for k, v in node.items() if k not in ("title", "default")}
        options = node.get("anyOf")
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            node.pop("anyOf")
            node = {**rest[0], **node} if len(rest) == 1 else {**node, "anyOf": rest}
        return node

    return walk(schema)  # type: ignore[no-any-return]
