"""The Anthropic dialect's request options beside the conversation: ``thinking``, ``tools`` and ``tool_choice``.

Pure functions (see :mod:`proxy.dialects.anthropic` for what each becomes in the chat body, and
for the messages themselves); every refusal is a 400 naming the field (``tools.1.input_schema``).
"""

from __future__ import annotations

import re
from typing import Any

from proxy.errors import InvalidRequest

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


def fail(param: str, message: str) -> InvalidRequest:
    """A 400 naming ``param`` (its message starts with it)."""
    return InvalidRequest(f"{param}: {message}", param=param)


THINKING = ("enabled", "disabled", "adaptive")
MIN_BUDGET = 1024  # Anthropic's floor for budget_tokens; vLLM's route holds it too


def check_thinking(thinking: Any, max_tokens: int) -> None:
    """Check ``thinking`` as the engine's route does (the model's reasoning is not ours to budget, so the
    budget is then ignored): one of its three types, and an ``enabled`` budget from 1,024 to below
    ``max_tokens`` (Anthropic's API refuses the same)."""
    if thinking is None:
        return
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING:
        raise fail("thinking.type", f"must be one of {', '.join(THINKING)}")
    if thinking["type"] != "enabled":
        return
    budget = integer(thinking.get("budget_tokens"))
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_BUDGET:
        raise fail("thinking.budget_tokens", f"must be an integer of at least {MIN_BUDGET}")
    if budget >= max_tokens:
        raise fail("thinking.budget_tokens", f"must be less than max_tokens ({max_tokens})")


def integer(value: Any) -> Any:
    """A JSON number with no fraction as an int (JSON Schema's integer, and pydantic's, take 16.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """The chat tools for a Messages ``tools`` list (server tools left out: the engine cannot run them)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise fail("tools", "must be a list of tool definitions")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools.{i}"
        if not isinstance(tool, dict):
            raise fail(at, "must be an object {name, description, input_schema}")
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, code execution): the engine cannot run it
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise fail(f"{at}.name", "must match ^[a-zA-Z0-9_-]{1,128}$")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise fail(f"{at}.input_schema", "field required: a JSON Schema object")
        if schema.get("type") != "object":
            raise fail(f"{at}.input_schema.type", "must be 'object'")
        if "properties" in schema and not isinstance(schema["properties"], dict):
            raise fail(f"{at}.input_schema.properties", "must be an object")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise fail(f"{at}.description", "must be a string")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if description is not None:
            function["description"] = description
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]  # constrains the arguments to the schema (vLLM's guided decoding)
        out.append({"type": "function", "function": function})
    return out


def tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[Any, bool] | None:
    """(chat tool_choice, parallel calls disabled), or None for the default."""
    if choice is None:
        return None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise fail("tool_choice.type", "must be one of 'auto', 'any', 'tool', 'none'")
    kind = choice["type"]
    no_parallel = bool(choice.get("disable_parallel_tool_use"))
    if kind in ("any", "tool") and not tools:
        raise fail("tool_choice", f"tool_choice {kind!r} needs a non-empty 'tools' list")
    if kind == "tool":
        name = choice.get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise fail("tool_choice.name", f"names no tool in 'tools': {name!r}")
        return {"type": "function", "function": {"name": name}}, no_parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], no_parallel
