"""The Gemini API dialect: a ``generateContent`` request becomes the engine's chat body, and back.

Google's REST API names the model and the mode in the path, not the body:
``POST /v1beta/models/{model}:generateContent`` answers whole, ``:streamGenerateContent?alt=sse``
streams (one SSE event per engine chunk, :mod:`proxy.dialects.gemini_stream`), and
``:countTokens`` counts the prompt (:mod:`proxy.dialects.gemini_routes`; not a call, not
recorded). A key comes as ``x-goog-api-key`` (the google-genai SDK), ``?key=`` or a Bearer
token, and is checked as every other dialect's is (proxy/auth.py). :func:`call_route` matches
those paths for the serving path's dispatcher (proxy/app.py) and gives a :class:`GeminiDialect`
bound to the call's model, mode and query key.

The translation (no engine has a Gemini route to be the oracle, so it is documented here):
``systemInstruction`` is a system message; each content is a user or assistant message
(``model`` is the assistant, consecutive contents of one role are one turn, as a streamed
history holds one content per chunk; a turn's text parts are joined with nothing between
them); ``functionCall`` parts are the assistant's tool calls (``args`` as ``json.dumps``,
as vLLM's tool parsers write arguments); ``functionResponse`` parts are ``tool`` messages
(their ``response`` as ``json.dumps``) ahead of the turn's text, each matched to the
previous turn's call by ``id`` when one has it, else by ``name`` in order. ``tools[].functionDeclarations``
are chat tools (``parameters``, Google's OpenAPI subset, becomes JSON Schema: types lower-cased,
``nullable`` a ``null`` type, ``propertyOrdering`` and ``example`` dropped;
``parametersJsonSchema`` as it is); ``toolConfig.functionCallingConfig`` is ``tool_choice``
(``ANY`` with one allowed name is that function, ``ANY`` otherwise ``required`` over the
allowed ones, ``NONE`` is ``none``, ``AUTO`` and ``VALIDATED`` are ``auto``; under ``ANY`` and
``VALIDATED`` the tools are ``strict``, as Google says those modes keep calls to the schema).
``generationConfig``: ``temperature``, ``topP``, ``topK``, ``maxOutputTokens``,
``stopSequences``, ``seed``, ``presencePenalty``, ``frequencyPenalty``, and
``responseMimeType: application/json`` with ``responseSchema``/``responseJsonSchema``
(structured output); ``candidateCount`` must be 1.

Ignored, as the engine cannot honour them and they do not change what a text model says:
``safetySettings``, ``labels``, ``store``, ``serviceTier``, ``thinkingConfig``,
``responseLogprobs``/``logprobs`` (no logprobs are answered), ``mediaResolution``,
``speechConfig``, hosted tools (``googleSearch``, ``codeExecution``, ``urlContext``, ...: left
out of what the engine sees), ``thought`` parts, ``thoughtSignature``, ``executableCode`` and
``codeExecutionResult`` parts in the history. Refused, naming the field: images, audio and
files (``inlineData``, ``fileData``; the model takes text only), ``cachedContent`` (we keep
no caches), ``candidateCount`` other than 1, a ``responseModalities`` other than text, a
``functionResponse`` that answers no call of the previous turn.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import parse_qs

import orjson

from proxy.dialects.base import Dialect, DialectStream, Exchange, Stored
from proxy.dialects.gemini_config import fail as _fail
from proxy.dialects.gemini_config import function_tools, generation_config, tool_config
from proxy.dialects.gemini_out import error_body, error_status, from_chat
from proxy.dialects.gemini_stream import GeminiStream
from proxy.errors import ApiError, NotFound

VERSIONS = ("/v1beta/models/", "/v1/models/")
METHODS = {"generateContent": False, "streamGenerateContent": True}  # method -> streams
MEDIA_PARTS = ("inlineData", "fileData")
IGNORED_PARTS = ("executableCode", "codeExecutionResult", "videoMetadata")


# --------------------------------------------------------------------------- request


def to_chat(body: dict[str, Any], model: str, stream: bool = False) -> dict[str, Any]:
    """The chat-completions body for a ``generateContent`` request to ``model`` (the client's alias)."""
    if body.get("cachedContent") is not None:
        raise _fail("cachedContent", "cached contents are not kept here: send the contents themselves")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _fail("contents", "must be a non-empty list of {role, parts} objects")
    messages = _system(body.get("systemInstruction"))
    previous_calls: list[dict[str, Any]] = []
    for role, parts in _turns(contents):
        previous_calls = _turn(role, parts, previous_calls, messages)
    if not any(m["role"] != "system" for m in messages):
        raise _fail("contents", "hold no text: give at least one non-empty part")
    out: dict[str, Any] = {"model": model, "messages": messages}
    last = messages[-1]
    if last["role"] == "assistant" and isinstance(last.get("content"), str) and not last.get("tool_calls"):
        out["continue_final_message"] = True  # a final model turn is continued, not answered
        out["add_generation_prompt"] = False
    if stream:
        out["stream"] = True
    generation_config(body.get("generationConfig"), out)
    tools = function_tools(body.get("tools"))
    if tools:
        choice, tools = tool_config(body.get("toolConfig"), tools)
        out["tools"], out["tool_choice"] = tools, choice
    return out


def dumps(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``, the same text at orjson's speed (its strings escape alike).

    The form vLLM's tool parsers write arguments in; a body parsed from JSON holds nothing else.
    """
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{dumps(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return json.dumps(value)  # numbers, true, false, null


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):  # the REST API wants a Content; a bare string is what it means
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, dict) or not isinstance(system.get("parts"), list):
        raise _fail("systemInstruction", "must be a content {parts: [{text}]}")
    texts = []
    for j, part in enumerate(system["parts"]):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise _fail(f"systemInstruction.parts[{j}]", "must be a text part {text: string}")
        texts.append(part["text"])
    text = "".join(texts)
    return [{"role": "system", "content": text}] if text else []


Located = tuple[int, int, dict[str, Any]]  # (content index, part index, part): its field path made only on error


def _at(i: int, j: int) -> str:
    return f"contents[{i}].parts[{j}]"


def _turns(contents: list[Any]) -> list[tuple[str, list[Located]]]:
    """(chat role, its parts) per turn: consecutive contents of one role are one turn."""
    turns: list[tuple[str, list[Located]]] = []
    for i, content in enumerate(contents):
        if not isinstance(content, dict):
            raise _fail(f"contents[{i}]", "must be an object {role, parts}")
        role = content.get("role") or "user"
        if role not in ("user", "model", "function"):
            raise _fail(f"contents[{i}].role", "must be 'user' or 'model'")
        chat_role = "assistant" if role == "model" else "user"
        parts = content.get("parts")
        if parts is None:
            parts = []
        if not isinstance(parts, list):
            raise _fail(f"contents[{i}].parts", "must be a list of parts")
        located = [(i, j, part) for j, part in enumerate(parts)]
        if turns and turns[-1][0] == chat_role:
            turns[-1][1].extend(located)
        else:
            turns.append((chat_role, located))
    return turns


def _turn(
    role: str, parts: list[Located], calls_before: list[dict[str, Any]], out: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Append one turn as chat messages; return the tool calls it made (for the next turn's responses)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    unanswered = list(calls_before)
    for i, j, part in parts:
        if not isinstance(part, dict):
            raise _fail(_at(i, j), "must be an object such as {text: string}")
        text = part.get("text")
        if text is not None:
            if not isinstance(text, str):
                raise _fail(f"{_at(i, j)}.text", "must be a string")
            if not part.get("thought"):  # a thought summary is not part of the answer
                texts.append(text)
        elif "functionCall" in part:
            if role != "assistant":
                raise _fail(f"{_at(i, j)}.functionCall", "function calls may only appear in 'model' contents")
            calls.append(_function_call(part["functionCall"], f"{_at(i, j)}.functionCall", len(out), len(calls)))
        elif "functionResponse" in part:
            if role != "user":
                raise _fail(f"{_at(i, j)}.functionResponse", "function responses may only appear in 'user' contents")
            out.append(_function_response(part["functionResponse"], f"{_at(i, j)}.functionResponse", unanswered))
        elif any(k in part for k in MEDIA_PARTS):
            kind = next(k for k in MEDIA_PARTS if k in part)
            raise _fail(f"{_at(i, j)}.{kind}", "images, audio and files are not supported: this model takes text only")
        elif (
            any(k in part for k in IGNORED_PARTS) or part.get("thought") or "thoughtSignature" in part or "text" in part
        ):
            continue  # hosted code execution's record, a thought, a null text: nothing the engine ran or can read
        else:
            raise _fail(_at(i, j), "must hold text, functionCall or functionResponse")
    text = "".join(texts)
    if role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        if text or calls:
            out.append(message)
    elif text:
        out.append({"role": "user", "content": text})
    return calls


def _function_call(call: Any, at: str, turn: int, k: int) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise _fail(f"{at}.name", "function calls need a function name")
    args = call.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _fail(f"{at}.args", "must be an object")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _fail(f"{at}.id", "must be a string")
    # As vLLM's tool parsers write arguments, so a resent call matches the captured reply.
    arguments = dumps(args)
    return {
        "id": call_id or f"call_{turn}_{k}",
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def _function_response(response: Any, at: str, unanswered: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool message for a function response, matched to a call of the previous turn (by id, else by name)."""
    if not isinstance(response, dict) or not isinstance(response.get("name"), str):
        raise _fail(f"{at}.name", "function responses need the name of the function called")
    name, call_id = response["name"], response.get("id")
    by_id = [c for c in unanswered if call_id and c["id"] == call_id]  # else by name: a history without ids
    matches = by_id or [c for c in unanswered if c["function"]["name"] == name]
    if not matches:
        field, named = ("id", call_id) if call_id else ("name", name)
        raise _fail(f"{at}.{field}", f"answers no function call {named!r} of the previous 'model' content")
    match = matches[0]
    unanswered.remove(match)
    value = response.get("response")
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _fail(f"{at}.response", "must be an object")
    return {"role": "tool", "tool_call_id": match["id"], "content": dumps(value)}


def count_tokens_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The engine's ``/tokenize`` body for ``countTokens``: the same rendering a call would get.

    The body is ``{contents}`` or ``{generateContentRequest: {contents, systemInstruction, tools, ...}}``.
    """
    request = body.get("generateContentRequest")
    if request is not None and not isinstance(request, dict):
        raise _fail("generateContentRequest", "must be a generateContent request object")
    chat = to_chat(request if request is not None else body, model)
    out: dict[str, Any] = {"model": model, "messages": chat["messages"]}
    if chat.get("continue_final_message"):
        out.update(continue_final_message=True, add_generation_prompt=False)
    else:
        out["add_generation_prompt"] = True
    if chat.get("tools"):
        out["tools"] = chat["tools"]
    return out


# --------------------------------------------------------------------------- routes


def parse_path(path: str) -> tuple[str | None, str, str] | None:
    """(session named by /s/{id}/, model, method) for a Gemini model path, or None."""
    session = None
    if path.startswith("/s/"):
        session, _, rest = path[3:].partition("/")
        path = "/" + rest
        if not session:
            return None
    for version in VERSIONS:
        if path.startswith(version):
            model, colon, method = path[len(version) :].rpartition(":")
            if colon and model and "/" not in model:
                return session, model, method
    return None


def call_route(path: str, query: bytes) -> tuple[str, str | None, Dialect] | None:
    """(endpoint, session, dialect bound to this call) for a Gemini call route, else None (proxy/app.py)."""
    found = parse_path(path)
    if found is None or found[2] not in METHODS:
        return None
    session, model, method = found
    params = parse_qs(query.decode("latin-1")) if query else {}
    key, alt = params.get("key", [None])[0], params.get("alt", [None])[0]
    return "chat", session, GeminiDialect(model, METHODS[method], key, alt)


class GeminiDialect(Dialect):
    """``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` through the one call path.

    One instance per call (:func:`call_route`): the model, the mode and a ``?key=`` come from its URL.
    """

    name = "gemini"
    paths: ClassVar[tuple[str, ...]] = ()  # matched by call_route: the model is in the path
    id_prefix = "gemini-"  # our completion id is the responseId, and x-request-id

    def __init__(self, model: str = "", streams: bool = False, key: str | None = None, alt: str | None = None):
        self.model, self.streams, self.key, self.alt = model, streams, key, alt

    def credentials(self, headers: dict[str, str]) -> str | None:
        """A Bearer token, else ``x-goog-api-key`` (the SDK's), else the ``?key=`` query parameter."""
        if headers.get("authorization"):
            return headers["authorization"]
        key = headers.get("x-goog-api-key") or self.key
        return f"Bearer {key}" if key else None

    def stream_requested(self, body: dict[str, Any]) -> bool:
        if self.streams and self.alt != "sse":
            raise _fail("alt", "streamGenerateContent is served as server-sent events only: add ?alt=sse")
        return self.streams

    def to_chat(self, body: dict[str, Any], previous: Stored | None) -> dict[str, Any]:
        if not self.model:
            raise NotFound("POST /v1beta/models/{model}:generateContent names the model", param="model")
        return to_chat(body, self.model, self.streams)

    def reply(self, chat: dict[str, Any], ex: Exchange) -> dict[str, Any]:
        return from_chat(chat, ex.id, ex.model)

    def stream(self, ex: Exchange) -> DialectStream:
        return GeminiStream(ex.id, ex.model)

    def error(self, exc: ApiError) -> tuple[int, dict[str, Any]]:
        return error_status(exc), error_body(exc)
