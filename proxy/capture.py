"""Capture: ask the engine for everything, record it, and give the client only what it asked for.

The engine is always asked for ``return_token_ids``, ``logprobs`` and (when streaming)
usage. :func:`strip` turns each reply or chunk back into what vLLM would have sent
this client, so the harness cannot tell the proxy is there. :class:`Assembler`
collects a stream chunk by chunk (token ids from the engine's own per-chunk
``token_ids``, never re-tokenised) into the same shape as a non-streamed reply.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.errors import InvalidRequest

FINISH_TO_TERMINATION = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "upstream_error"}
SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    # These change the distribution vLLM samples from; the trainer excludes calls it cannot reproduce.
    "logit_bias",
    "min_tokens",
    "bad_words",
    "allowed_token_ids",
)


@dataclass(frozen=True)
class Wants:
    """What the client itself asked for; everything else we requested is stripped."""

    logprobs: bool
    token_ids: bool
    usage: bool
    stream: bool


def prepare(body: dict[str, Any], endpoint: str, served_model: str) -> tuple[dict[str, Any], Wants]:
    """The upstream body (model rewritten, capture fields forced on) and what the client wanted."""
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    if endpoint == "chat":
        wants_lp = bool(body.get("logprobs"))
    else:
        wants_lp = body.get("logprobs") is not None
    wants = Wants(
        logprobs=wants_lp,
        token_ids=bool(body.get("return_token_ids")),
        usage=bool(options.get("include_usage")) if isinstance(options, dict) else False,
        stream=stream,
    )
    out = dict(body)
    out["model"] = served_model
    out["return_token_ids"] = True
    if endpoint == "chat":
        out["logprobs"] = True
    elif out.get("logprobs") is None:
        out["logprobs"] = 0  # completions API: 0 returns the sampled token's logprob only
    if stream:
        out["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return out, wants


def check_one_prompt(prompt: Any) -> None:
    """A completions ``prompt`` must be one prompt (a string, token ids, or a list holding one of those).

    One call is one recorded turn with one prompt's token ids; several prompts in one call
    would be recorded under the first one's ids. Refused (400) rather than split.
    """
    several = isinstance(prompt, list) and any(isinstance(x, str | list | dict) for x in prompt)  # else: ids
    if several and len(prompt) > 1:
        raise InvalidRequest(
            f"'prompt' holds {len(prompt)} prompts: send one prompt per call (a string, a list of token ids, "
            "or a list holding one of those); for several samples of one prompt use 'n'",
            param="prompt",
        )


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """The effective sampling parameters (vLLM's defaults where the client gave none)."""
    params = {k: body[k] for k in SAMPLING_KEYS if body.get(k) is not None}
    for key, default in SAMPLING_DEFAULTS.items():
        params.setdefault(key, default)
    params.setdefault("n", 1)
    return params


def strip(obj: dict[str, Any], wants: Wants, alias: str) -> dict[str, Any] | None:
    """Make a reply or chunk look as vLLM would have sent it to this client (None: drop the chunk)."""
    if wants.stream and not wants.usage and not obj.get("choices") and obj.get("usage") is not None:
        return None  # the usage-only chunk we asked for
    if wants.stream and not (wants.logprobs or wants.token_ids) and _only_metadata(obj):
        # vLLM sends a chunk for every token when ids or logprobs are asked for, even with no
        # text yet (a split UTF-8 character, a tool-parser control token); otherwise it skips it.
        return None
    if "model" in obj:
        obj["model"] = alias
    if not wants.token_ids and obj.get("prompt_token_ids") is not None:
        obj["prompt_token_ids"] = None
    for choice in obj.get("choices") or ():
        if not wants.token_ids:
            if choice.get("token_ids") is not None:
                choice["token_ids"] = None
            if choice.get("prompt_token_ids") is not None:
                choice["prompt_token_ids"] = None
        if not wants.logprobs and choice.get("logprobs") is not None:
            choice["logprobs"] = None
    return obj


def _only_metadata(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices") or []
    return bool(choices) and all(c.get("delta") == {} and c.get("finish_reason") is None for c in choices)


def choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """Sampled-token logprobs of one choice (chat or completions shape), or None if absent."""
    lp = choice.get("logprobs")
    if not lp:
        return None
    if "content" in lp:
        return [float(t["logprob"]) for t in (lp.get("content") or [])]
    if "token_logprobs" in lp:
        return [float(x) if x is not None else float("nan") for x in lp["token_logprobs"]]
    return None


def choice_pieces(choice: dict[str, Any]) -> list[Any] | None:
    """The engine's per-token entries (chat: dicts with ``bytes``; completions: token strings), uncopied.

    Transient: :func:`proxy.redact.redact_record` reads them to redact token ids and drops them.
    """
    lp = choice.get("logprobs")
    if not lp:
        return None
    pieces = lp.get("content") if "content" in lp else lp.get("tokens")
    return pieces if isinstance(pieces, list) else None


def captured_choices(response: dict[str, Any], endpoint: str) -> list[dict[str, Any]]:
    """Per choice: token ids, behaviour logprobs, finish reason, the message/text (and transient pieces)."""
    out = []
    for choice in response.get("choices") or ():
        item: dict[str, Any] = {
            "index": choice.get("index", 0),
            "token_ids": choice.get("token_ids"),
            "logprobs": choice_logprobs(choice),
            "finish_reason": choice.get("finish_reason"),
            "pieces": choice_pieces(choice),
        }
        if endpoint == "chat":
            item["message"] = _clean_message(choice.get("message") or {})
        else:
            item["text"] = choice.get("text")
        out.append(item)
    return out


def prompt_ids(response: dict[str, Any]) -> list[int] | None:
    ids = response.get("prompt_token_ids")
    if ids is None:
        choices = response.get("choices") or []
        if choices:
            ids = choices[0].get("prompt_token_ids")
    return list(ids) if ids is not None else None


_IDS_NAME = b'"prompt_token_ids"'
_IDS_KEY = _IDS_NAME + b":["
_IDS_KEY_SPACED = _IDS_NAME + b": ["


def split_prompt_ids(raw: bytes) -> tuple[bytes, bytes | None]:
    """``raw`` (an engine reply or chunk, JSON) with its ``prompt_token_ids`` list written ``null``, and that
    list's JSON as it came, to be stored as it is; ``(raw, None)`` when there is none, or when the list
    holds anything but numbers (a nested list, an object, a string).

    The list is as long as the prompt: a coding agent's late turn carries 150,000 ids, which cost parsing
    and serialising again milliseconds a call, growing with the conversation. Cut out here, they are only
    copied (:func:`parse_cutting_ids` parses what is left). A key of that name inside a string is escaped,
    so never matches here."""
    at, key = raw.find(_IDS_KEY), _IDS_KEY
    if at < 0:  # Python's json writes ": "
        at, key = raw.find(_IDS_KEY_SPACED), _IDS_KEY_SPACED
        if at < 0:
            return raw, None
    start = at + len(key) - 1
    end = raw.find(b"]", start)
    if end < 0 or any(raw.find(c, start + 1, end) >= 0 for c in (b"[", b"{", b'"')):
        return raw, None
    if raw.find(_IDS_NAME, 0, at) >= 0 or raw.find(_IDS_NAME, end) >= 0:
        return raw, None  # the name twice (a choice's list and the reply's): which is whose is not known here
    return raw[:start] + b"null" + raw[end + 1 :], raw[start : end + 1]


def parse_cutting_ids(raw: bytes, cut: bool) -> tuple[Any, bytes | None]:
    """``raw`` parsed, and with ``cut`` its top-level prompt ids' JSON kept as it came (:func:`split_prompt_ids`)
    rather than parsed (the parsed reply reads null there); ``(parsed, None)`` when they are not cut out.
    Raises what ``orjson.loads(raw)`` raises."""
    if cut:
        rest, ids = split_prompt_ids(raw)
        if ids is not None:
            with contextlib.suppress(orjson.JSONDecodeError):
                obj = orjson.loads(rest)
                # The list cut out was the reply's own (a top-level key that now reads null), not a nested one.
                if isinstance(obj, dict) and "prompt_token_ids" in obj and obj["prompt_token_ids"] is None:
                    return obj, ids
    return orjson.loads(raw), None


def termination_of(choices: list[dict[str, Any]]) -> str:
    if not choices:
        return "upstream_error"
    return FINISH_TO_TERMINATION.get(str(choices[0].get("finish_reason")), "stop")


def _clean_message(message: dict[str, Any]) -> dict[str, Any]:
    keep = {k: message[k] for k in ("role", "content", "tool_calls", "reasoning") if message.get(k) is not None}
    keep.setdefault("role", "assistant")
    keep.setdefault("content", message.get("content"))
    return keep


@dataclass
class _ChoiceAcc:
    index: int
    content: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprobs_seen: bool = False
    pieces: list[Any] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    stop_reason: Any = None


class Assembler:
    """Builds the non-streamed equivalent of a stream, from the chunks as the engine sent them."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.head: dict[str, Any] = {}
        # a list, or its JSON as the engine wrote it (cut out of the first chunk: :func:`split_prompt_ids`)
        self.prompt_token_ids: list[int] | bytes | None = None
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, _ChoiceAcc] = {}
        self.chunks = 0

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            acc = self.choices.setdefault(choice.get("index", 0), _ChoiceAcc(choice.get("index", 0)))
            if choice.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
                self.prompt_token_ids = list(choice["prompt_token_ids"])
            if choice.get("token_ids"):
                acc.token_ids.extend(choice["token_ids"])
            lps = choice_logprobs(choice)
            if lps is not None:
                acc.logprobs_seen = True
                acc.logprobs.extend(lps)
                pieces = choice_pieces(choice)
                if pieces:
                    acc.pieces.extend(pieces)
            delta = choice.get("delta") or {}
            if delta.get("content"):
                acc.content.append(delta["content"])
            if choice.get("text"):
                acc.text.append(choice["text"])
            for call in delta.get("tool_calls") or ():
                slot = acc.tool_calls.setdefault(
                    call.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason") is not None:
                acc.finish_reason = choice["finish_reason"]
                acc.stop_reason = choice.get("stop_reason")

    def response(self) -> dict[str, Any]:
        """The assembled reply (what the stream added up to), shaped like a non-streamed one."""
        internal = ("token_ids", "logprobs", "pieces")
        choices = [{k: v for k, v in c.items() if k not in internal} for c in self.captured_choices()]
        obj = "chat.completion" if self.endpoint == "chat" else "text_completion"
        return {**self.head, "object": obj, "choices": choices, "usage": self.usage}

    def captured_choices(self) -> list[dict[str, Any]]:
        out = []
        for index in sorted(self.choices):
            acc = self.choices[index]
            item: dict[str, Any] = {
                "index": index,
                "token_ids": acc.token_ids,
                "logprobs": acc.logprobs if acc.logprobs_seen else None,
                "finish_reason": acc.finish_reason,
                "pieces": acc.pieces if acc.logprobs_seen else None,
            }
            if self.endpoint == "chat":
                message: dict[str, Any] = {"role": "assistant", "content": "".join(acc.content)}
                if acc.tool_calls:
                    message["tool_calls"] = [acc.tool_calls[i] for i in sorted(acc.tool_calls)]
                item["message"] = message
            else:
                item["text"] = "".join(acc.text)
            out.append(item)
        return out
