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
    _contents(contents, messages)
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
    Written as bytes, each string, integer, boolean and null by orjson and each float as
    ``json.dumps`` writes it (the two write some apart: ``1e-07``, ``1e-7``); a value holding
    anything else, or one orjson refuses (an integer past 64 bits), takes :func:`_dumps`.
    """
    try:
        return _json(value).decode()
    except TypeError:
        return _dumps(value)


def _json(value: Any) -> bytes:
    """:func:`dumps`' text as bytes (TypeError: a value JSON does not parse to, or one orjson refuses)."""
    kind = value.__class__
    if kind is str or kind is int or kind is bool or value is None:
        return orjson.dumps(value)
    if kind is dict:
        if not value:
            return b"{}"
        parts = [b"{"]
        for key, item in value.items():
            kind = item.__class__
            parts += (
                orjson.dumps(key if key.__class__ is str else str(key)),
                b": ",
                orjson.dumps(item) if kind is str or kind is int or kind is bool or item is None else _json(item),
                b", ",
            )
        parts[-1] = b"}"
        return b"".join(parts)
    if kind is list:
        return b"[" + b", ".join([_json(v) for v in value]) + b"]"
    if kind is float:
        return json.dumps(value).encode()
    raise TypeError(f"{kind.__name__} is not a type JSON parses to")


def _dumps(value: Any) -> str:
    """:func:`dumps` of any value, as ``json.dumps`` would write it (a string by orjson: its escapes are the same)."""
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_dumps(str(k))}: {_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dumps(v) for v in value) + "]"
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


def _at(i: int, j: int) -> str:
    return f"contents[{i}].parts[{j}]"


def _contents(contents: list[Any], out: list[dict[str, Any]]) -> None:
    """Append the contents as chat messages, turn by turn: consecutive contents of one role are one turn.

    One pass. A content's shape (an object, its role, its parts a list) is checked before its
    parts are read; a part refused is refused only once every later content's shape passed too
    (the first bad content is named before a bad part of an earlier one, as a pass over all the
    contents' shapes first would).
    """
    role = None  # the turn's chat role
    texts: list[str] = []
    calls: list[dict[str, Any]] = []  # the turn's tool calls
    before: list[dict[str, Any]] = []  # the previous turn's, which this turn's function responses answer
    unanswered: list[dict[str, Any]] | None = None  # before, less those answered (copied at the first response)
    for i, content in enumerate(contents):
        chat_role, parts = _shape(content, i)
        if chat_role != role:
            if role is not None:
                before = _close(role, texts, calls, out)
                texts, calls, unanswered = [], [], None
            role = chat_role
        try:
            for j, part in enumerate(parts):
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
                    calls.append(_function_call(part["functionCall"], i, j, len(out), len(calls)))
                elif "functionResponse" in part:
                    if role != "user":
                        raise _fail(
                            f"{_at(i, j)}.functionResponse", "function responses may only appear in 'user' contents"
                        )
                    if unanswered is None:
                        unanswered = list(before)
                    out.append(_function_response(part["functionResponse"], i, j, unanswered))
                else:
                    _other_part(part, i, j)
        except Exception:
            for k in range(i + 1, len(contents)):
                _shape(contents[k], k)  # a later content's shape is named first
            raise
    if role is not None:
        _close(role, texts, calls, out)


def _shape(content: Any, i: int) -> tuple[str, list[Any]]:
    """(chat role, parts) of content ``i``, its shape checked."""
    if not isinstance(content, dict):
        raise _fail(f"contents[{i}]", "must be an object {role, parts}")
    role = content.get("role") or "user"
    if role == "model":
        chat_role = "assistant"
    elif role == "user" or role == "function":
        chat_role = "user"
    else:
        raise _fail(f"contents[{i}].role", "must be 'user' or 'model'")
    parts = content.get("parts")
    if parts is None:
        return chat_role, []
    if not isinstance(parts, list):
        raise _fail(f"contents[{i}].parts", "must be a list of parts")
    return chat_role, parts


def _close(role: str, texts: list[str], calls: list[dict[str, Any]], out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append a turn's message (its text parts joined with nothing between them, its tool calls); return the
    calls (the next turn's function responses answer them)."""
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


def _other_part(part: dict[str, Any], i: int, j: int) -> None:
    """A part with no text, call or response: skipped when the engine has nothing to read in it, else refused."""
    for kind in MEDIA_PARTS:
        if kind in part:
            raise _fail(f"{_at(i, j)}.{kind}", "images, audio and files are not supported: this model takes text only")
    if any(k in part for k in IGNORED_PARTS) or part.get("thought") or "thoughtSignature" in part or "text" in part:
        return  # hosted code execution's record, a thought, a null text: nothing the engine ran or can read
    raise _fail(_at(i, j), "must hold text, functionCall or functionResponse")


def _function_call(call: Any, i: int, j: int, turn: int, k: int) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise _fail(f"{_at(i, j)}.functionCall.name", "function calls need a function name")
    args = call.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _fail(f"{_at(i, j)}.functionCall.args", "must be an object")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _fail(f"{_at(i, j)}.functionCall.id", "must be a string")
    # As vLLM's tool parsers write arguments, so a resent call matches the captured reply.
    arguments = dumps(args)
    return {
        "id": call_id or f"call_{turn}_{k}",
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def _function_response(response: Any, i: int, j: int, unanswered: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool message for a function response, matched to a call of the previous turn (by id, else by name)."""
    if not isinstance(response, dict) or not isinstance(response.get("name"), str):
        raise _fail(f"{_at(i, j)}.functionResponse.name", "function responses need the name of the function called")
    name, call_id = response["name"], response.get("id")
    match = None
    if call_id:
        for call in unanswered:
            if call["id"] == call_id:
                match = call
                break
    if match is None:  # else by name: a history without ids
        for call in unanswered:
            if call["function"]["name"] == name:
                match = call
                break
    if match is None:
        field, named = ("id", call_id) if call_id else ("name", name)
        raise _fail(
            f"{_at(i, j)}.functionResponse.{field}",
            f"answers no function call {named!r} of the previous 'model' content",
        )
    unanswered.remove(match)
    value = response.get("response")
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _fail(f"{_at(i, j)}.functionResponse.response", "must be an object")
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
