"""The Responses dialect's tools, translated to chat tools: function tools as they are, ``namespace``
tools flattened the way vLLM's own route flattens them, ``custom`` tools as the one-string function that
route shows the model, hosted tools (``web_search``, ``file_search``...) left out of what the engine sees,
as the engine does; and ``tool_choice`` checked against them."""

from __future__ import annotations

from typing import Any

from proxy.dialects.responses_out import CUSTOM_INPUT_KEY, NAMESPACE_SEPARATOR, flat_name
from proxy.errors import InvalidRequest

# Tools the openai SDK knows that only OpenAI's servers run: left out of what the engine sees, as its route does.
HOSTED_TOOLS = frozenset(
    {
        "file_search",
        "computer",
        "computer_use_preview",
        "web_search",
        "web_search_2025_08_26",
        "mcp",
        "code_interpreter",
        "programmatic_tool_calling",
        "image_generation",
        "local_shell",
        "shell",
        "tool_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "apply_patch",
    }
)


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses tools → chat tools, as vLLM's own route shows them to the model.

    Function tools nest under ``function``; a ``namespace`` tool's functions are flattened to
    ``<namespace>__<name>`` (its description and its custom tools are not shown, as there); a ``custom``
    tool is a function of its name and description taking one required string, ``input`` (vLLM's
    ``custom_tool_as_function_dict``; the model's call to it comes back as a ``custom_tool_call``); hosted
    tools the engine cannot run (``web_search``, ``file_search``, ``code_interpreter``, ...) are left
    out; a custom tool with a ``grammar`` format (the engine refuses it too) and types no SDK knows are
    refused with the field named.
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be a list of function tools", param="tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where)
        kind = tool.get("type")
        if kind == "namespace":
            out.extend(_namespace_tools(tool, where))
            continue
        if kind in HOSTED_TOOLS:
            continue  # the engine's own route never shows these to the model either
        if kind == "custom":
            out.append(_custom_tool(tool, where))
            continue
        if kind != "function":
            raise InvalidRequest(
                f"'{where}.type': {kind!r} tools are not supported here (function, custom and namespace tools "
                "are; hosted tools are left out)",
                param=f"{where}.type",
            )
        out.append(_function_tool(tool, where))
    return out


def _namespace_tools(tool: dict[str, Any], where: str) -> list[dict[str, Any]]:
    namespace, inner = tool.get("name"), tool.get("tools")
    if not isinstance(namespace, str) or not namespace:
        raise InvalidRequest(f"'{where}.name' must be a non-empty string (the namespace)", param=f"{where}.name")
    if not isinstance(inner, list):
        raise InvalidRequest(f"'{where}.tools' must be a list of function tools", param=f"{where}.tools")
    out = []
    for j, function in enumerate(inner):
        at = f"{where}.tools[{j}]"
        if not isinstance(function, dict):
            raise InvalidRequest(f"'{at}' must be an object", param=at)
        if function.get("type") != "function":
            continue  # a custom tool in a namespace: vLLM shows only the functions
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"'{at}.name' must be a non-empty string", param=f"{at}.name")
        out.append(_function_tool({**function, "name": flat_name(namespace, name)}, at, limit=None))
    return out


def _function_tool(tool: dict[str, Any], where: str, limit: int | None = 64) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name or (limit is not None and len(name) > limit):
        raise InvalidRequest(
            f"'{where}.name' must be a non-empty string (at most 64 characters)", param=f"{where}.name"
        )
    params = tool.get("parameters")
    if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
        raise InvalidRequest(f"'{where}.parameters' must be a JSON schema of type object", param=f"{where}.parameters")
    function: dict[str, Any] = {"name": name, "parameters": params or {"type": "object", "properties": {}}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = bool(tool["strict"])
    return {"type": "function", "function": function}


def custom_tool_parameters() -> dict[str, Any]:
    """The schema of the function a ``custom`` tool is shown as: the one the engine's route renders, key for
    key in its order (the chat template writes it out as JSON, so the order is part of the prompt)."""
    return {
        "type": "object",
        "properties": {
            CUSTOM_INPUT_KEY: {"type": "string", "description": "The freeform text payload for this tool."},
        },
        "required": [CUSTOM_INPUT_KEY],
        "additionalProperties": False,
    }


def _custom_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``custom`` tool as the function the engine's route shows for it (never ``strict``: it is not there)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"'{where}.name' must be a non-empty string", param=f"{where}.name")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"'{where}.description' must be a string", param=f"{where}.description")
    fmt = tool.get("format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "grammar":
            raise InvalidRequest(
                f"'{where}.format': custom tools with a grammar format are not supported (the engine refuses "
                "them too); only free-form text custom tools are",
                param=f"{where}.format",
            )
        if kind != "text":
            raise InvalidRequest(
                f'\'{where}.format\' must be {{"type": "text"}} (or absent: free-form text)', param=f"{where}.format"
            )
    function: dict[str, Any] = {"name": name, "parameters": custom_tool_parameters()}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def tool_choice(choice: Any, tools: list[dict[str, Any]]) -> Any:
    """``auto``/``none``/``required`` as they are; a named function or custom tool in chat's nested form.

    As on the engine's route, ``{"type": "custom", "name": ...}`` and ``{"type": "function", "name": ...}``
    both name any tool the model is shown (a custom tool is a function to it)."""
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' is 'required' but no tools were given", param="tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = choice.get("name")
        names = {t["function"]["name"] for t in tools}
        if name not in names and isinstance(name, str):  # a namespaced function by its own name, as vLLM takes it
            flat = [n for n in names if n.endswith(NAMESPACE_SEPARATOR + name)]
            if len(flat) > 1:
                raise InvalidRequest(
                    f"'tool_choice.name' {name!r} is ambiguous: it is in more than one namespace ({', '.join(flat)})",
                    param="tool_choice.name",
                )
            name = flat[0] if flat else name
        if name not in names:
            raise InvalidRequest(f"'tool_choice.name' {name!r} is not one of the tools given", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise InvalidRequest(
        '\'tool_choice\' must be auto, none, required, {"type": "function", "name": ...} or '
        '{"type": "custom", "name": ...}',
        param="tool_choice",
    )
