"""The Gemini dialect's request options: ``generationConfig``, function declarations and ``toolConfig``.

Pure functions (see :mod:`proxy.dialects.gemini` for what each field becomes in the chat body);
every refusal is a 400 naming the field the way Google paths them (``tools[0].functionDeclarations[1].name``).
"""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequest

SCHEMA_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")
SCHEMA_DROPPED = ("propertyOrdering", "example", "nullable")
MODES = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none", "MODE_UNSPECIFIED": "auto"}


def fail(param: str, message: str) -> InvalidRequest:
    """A 400 naming ``param`` (its message starts with it)."""
    return InvalidRequest(f"{param}: {message}", param=param)


def _number(config: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = config.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise fail(f"generationConfig.{name}", f"must be a number from {low:g} to {high:g}")
    return value


def _integer(config: dict[str, Any], name: str, low: int) -> int | None:
    value = config.get(name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise fail(f"generationConfig.{name}", f"must be an integer of at least {low}")
    return value


def generation_config(config: Any, out: dict[str, Any]) -> None:
    if config is None:
        return
    if not isinstance(config, dict):
        raise fail("generationConfig", "must be an object")
    for name, chat, low, high in (
        ("temperature", "temperature", 0.0, 2.0),
        ("topP", "top_p", 0.0, 1.0),
        ("presencePenalty", "presence_penalty", -2.0, 2.0),
        ("frequencyPenalty", "frequency_penalty", -2.0, 2.0),
    ):
        value = _number(config, name, low, high)
        if value is not None:
            out[chat] = value
    for name, chat, low in (("maxOutputTokens", "max_tokens", 1), ("topK", "top_k", 0), ("seed", "seed", -(2**63))):
        whole = _integer(config, name, low)
        if whole is not None:
            out[chat] = (whole or -1) if chat == "top_k" else whole  # topK 0: no cut, vLLM's -1
    count = _integer(config, "candidateCount", 1)
    if count is not None and count != 1:
        raise fail("generationConfig.candidateCount", "only 1 candidate is served here")
    stops = config.get("stopSequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise fail("generationConfig.stopSequences", "must be a list of non-empty strings")
        if stops:
            out["stop"] = list(stops)
    modalities = config.get("responseModalities")
    if modalities is not None and (not isinstance(modalities, list) or any(m != "TEXT" for m in modalities)):
        raise fail("generationConfig.responseModalities", "only ['TEXT'] is served: this model writes text")
    mime = config.get("responseMimeType")
    if mime not in (None, "", "text/plain", "application/json"):
        raise fail("generationConfig.responseMimeType", "must be 'text/plain' or 'application/json'")
    if mime == "application/json":
        if config.get("responseJsonSchema") is not None:
            schema = config["responseJsonSchema"]
            if not isinstance(schema, dict):
                raise fail("generationConfig.responseJsonSchema", "must be a JSON Schema object")
        elif config.get("responseSchema") is not None:
            schema = _schema(config["responseSchema"], "generationConfig.responseSchema")
        else:
            out["response_format"] = {"type": "json_object"}
            return
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}


def _schema(schema: Any, at: str) -> dict[str, Any]:
    """Google's OpenAPI-subset ``Schema`` as JSON Schema (what the engine's tools and guided decoding take)."""
    if not isinstance(schema, dict):
        raise fail(at, "must be a schema object")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in SCHEMA_DROPPED:
            continue
        if key == "type":
            kind = value.lower() if isinstance(value, str) else value
            if kind == "type_unspecified":
                continue
            if kind not in SCHEMA_TYPES:
                raise fail(f"{at}.type", f"must be one of {', '.join(t.upper() for t in SCHEMA_TYPES)}")
            out["type"] = kind
        elif key == "properties":
            if not isinstance(value, dict):
                raise fail(f"{at}.properties", "must be an object of schemas")
            out["properties"] = {name: _schema(s, f"{at}.properties.{name}") for name, s in value.items()}
        elif key == "items":
            out["items"] = _schema(value, f"{at}.items")
        elif key in ("anyOf", "oneOf"):
            if not isinstance(value, list):
                raise fail(f"{at}.{key}", "must be a list of schemas")
            out[key] = [_schema(s, f"{at}.{key}[{n}]") for n, s in enumerate(value)]
        elif key == "defs":
            out["$defs"] = value
        elif key == "ref":
            out["$ref"] = value
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def function_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise fail("tools", "must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise fail(f"tools[{i}]", "must be an object such as {functionDeclarations: [...]}")
        declarations = tool.get("functionDeclarations")
        if declarations is None:
            continue  # a hosted tool (googleSearch, codeExecution, urlContext, ...): the engine cannot run it
        if not isinstance(declarations, list):
            raise fail(f"tools[{i}].functionDeclarations", "must be a list of function declarations")
        for j, declaration in enumerate(declarations):
            out.append(_declaration(declaration, f"tools[{i}].functionDeclarations[{j}]"))
    return out


def _declaration(declaration: Any, at: str) -> dict[str, Any]:
    if not isinstance(declaration, dict):
        raise fail(at, "must be an object {name, description, parameters}")
    name = declaration.get("name")
    if not isinstance(name, str) or not name or len(name) > 128:
        raise fail(f"{at}.name", "must be a function name of 1 to 128 characters")
    if declaration.get("parametersJsonSchema") is not None:
        parameters = declaration["parametersJsonSchema"]
        if not isinstance(parameters, dict):
            raise fail(f"{at}.parametersJsonSchema", "must be a JSON Schema object")
    elif declaration.get("parameters") is not None:
        parameters = _schema(declaration["parameters"], f"{at}.parameters")
    else:
        parameters = {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    description = declaration.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise fail(f"{at}.description", "must be a string")
        function["description"] = description
    return {"type": "function", "function": function}


def tool_config(config: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(chat tool_choice, the tools the engine sees) for ``toolConfig``."""
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    if config is not None and not isinstance(config, dict):
        raise fail("toolConfig", "must be an object {functionCallingConfig}")
    if calling is None:
        return "auto", tools
    if not isinstance(calling, dict):
        raise fail("toolConfig.functionCallingConfig", "must be an object {mode, allowedFunctionNames}")
    mode = calling.get("mode") or "AUTO"
    if mode not in MODES:
        raise fail("toolConfig.functionCallingConfig.mode", "must be AUTO, ANY, NONE or VALIDATED")
    allowed = calling.get("allowedFunctionNames")
    if allowed is not None:
        names = {t["function"]["name"] for t in tools}
        if not isinstance(allowed, list) or not all(isinstance(n, str) and n in names for n in allowed):
            raise fail(
                "toolConfig.functionCallingConfig.allowedFunctionNames",
                f"must name functions declared in 'tools' ({', '.join(sorted(names))})",
            )
    if mode in ("ANY", "VALIDATED"):  # Google: these modes ensure the calls adhere to the schema (guided decoding)
        tools = [{**t, "function": {**t["function"], "strict": True}} for t in tools]
    if mode != "ANY" or not allowed:
        return MODES[mode], tools
    if len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}, tools
    return "required", [t for t in tools if t["function"]["name"] in allowed]
