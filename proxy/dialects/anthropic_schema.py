"""The OpenAPI documentation of a Messages request (``POST /v1/messages`` and count_tokens, proxy/routes_anthropic.py).

Documentation only, the text-only core typed as :mod:`proxy.dialects.anthropic` checks it: tool blocks
and tools are accepted too, checked there with the field named, beyond what a schema can say. Nothing on
the serving path reads these.
"""

from __future__ import annotations

from typing import Any

from proxy.dialects.anthropic import ROLES

TEXT_BLOCK = {
    "type": "object",
    "required": ["type", "text"],
    "additionalProperties": True,
    "properties": {"type": {"enum": ["text"]}, "text": {"type": "string", "minLength": 1}},
}
TEXT = {"oneOf": [{"type": "string"}, {"type": "array", "items": TEXT_BLOCK}]}
CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": TEXT_BLOCK, "minItems": 1}]}
# An inline system message with no text is dropped (as vLLM drops it): alone it leaves nothing to answer.
SYSTEM_CONTENT = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": TEXT_BLOCK, "minItems": 1}]}
MESSAGE = {
    "oneOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "additionalProperties": True,
            "properties": {"role": {"enum": list(ROLES)}, "content": CONTENT},
        },
        {
            "type": "object",
            "required": ["role", "content"],
            "additionalProperties": True,
            "properties": {"role": {"enum": ["system"]}, "content": SYSTEM_CONTENT},
        },
    ]
}
COUNT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "system": TEXT,
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    },
}
MESSAGES_SCHEMA: dict[str, Any] = {
    **COUNT_SCHEMA,
    "required": ["model", "messages", "max_tokens"],
    "properties": {
        **COUNT_SCHEMA["properties"],
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1},
    },
}
