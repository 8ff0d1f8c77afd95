"""Gemini's ``streamGenerateContent?alt=sse``, translated chunk by chunk from the engine's chat stream.

One :class:`GeminiStream` per call. Each engine chunk that carries text becomes one SSE event
(``data: {GenerateContentResponse}``) at once, holding that text; Gemini has no partial
function calls, so a call's argument pieces are gathered and its ``functionCall`` part goes
out whole as soon as the engine finishes the choice. :meth:`close` (sent only after the record
is on disk) is the last event: ``finishReason`` and the usage. :attr:`result` is the one
response the events add up to (stored as the client's reply): it equals what
:func:`proxy.dialects.gemini_out.from_chat` makes of the non-streamed reply.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.base import DialectStream, StreamEnd
from proxy.dialects.gemini_out import GOOGLE_ERRORS, error_body, finish_reason, function_call, response, usage
from proxy.errors import ApiError

END = b"\n\n"  # Google frames with CRLF; LF is as valid SSE and what naive parsers split on


def event(body: dict[str, Any]) -> bytes:
    """One SSE event as Google frames them: a ``data:`` line, no event name."""
    return b"data: " + orjson.dumps(body) + END


class GeminiStream(DialectStream):
    """The per-stream state: text so far, tool-call slots, the finish reason, the prompt's length."""

    def __init__(self, response_id: str, model: str) -> None:
        self.id, self.model = response_id, model
        self.texts: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # chat tool-call index -> [id, name, argument pieces]
        self.calls_sent = False
        self.finish: str | None = None
        self.prompt_ids = 0
        self.output_ids = 0
        self.parts: list[dict[str, Any]] = []  # the function calls sent
        self._result: dict[str, Any] | None = None
        tail = b'}],"role":"model"},"index":0}],"usageMetadata":'
        self._head = b'data: {"candidates":[{"content":{"parts":[{"text":'
        self._tail = tail
        self._ids = b',"modelVersion":' + orjson.dumps(model) + b',"responseId":' + orjson.dumps(response_id) + b"}"

    @property
    def result(self) -> dict[str, Any] | None:
        return self._result

    def open(self) -> bytes:
        return b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        if not self.prompt_ids:
            ids = chunk.get("prompt_token_ids")
            if ids is None and chunk.get("choices"):
                ids = chunk["choices"][0].get("prompt_token_ids")
            self.prompt_ids = len(ids) if ids else 0
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self.output_ids += len(choice.get("token_ids") or ())
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self.texts.append(text)
                out += self._text(text)
            for call in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(call.get("index", 0), [None, None, []])
                fn = call.get("function") or {}
                slot[0] = slot[0] or call.get("id")
                slot[1] = slot[1] or fn.get("name")
                if fn.get("arguments"):
                    slot[2].append(fn["arguments"])
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
                out += self._send_calls()
        return out

    def close(self, end: StreamEnd | None = None) -> bytes:
        """The last event: calls not yet sent, ``finishReason`` and the usage; or Google's error body."""
        out = self._send_calls()
        parts = ([{"text": "".join(self.texts)}] if self.texts else []) + self.parts
        chat_usage = (end.usage if end else None) or {"completion_tokens": self.output_ids}
        meta = usage(chat_usage, self.prompt_ids)
        if end is not None and end.error is not None:
            self._result = response(self.id, self.model, parts or [{"text": ""}], "OTHER", meta)
            code, status = GOOGLE_ERRORS[504 if end.termination == "timeout" else 502]
            return out + event({"error": {"code": code, "message": end.error, "status": status}})
        reason = finish_reason(self.finish or (end.termination if end else None)) or "OTHER"
        self._result = response(self.id, self.model, parts or [{"text": ""}], reason, meta)
        return out + event(response(self.id, self.model, [{"text": ""}], reason, meta))

    def fail(self, exc: ApiError) -> bytes:
        """The record could not be kept (spool full): Google's error body as the stream's last event."""
        return event(error_body(exc))

    def _text(self, text: str) -> bytes:
        # The one event per token: a byte template instead of a dict through orjson (the same JSON).
        meta = b'{"promptTokenCount":%d,"candidatesTokenCount":%d,"totalTokenCount":%d}' % (
            self.prompt_ids,
            self.output_ids,
            self.prompt_ids + self.output_ids,
        )
        return self._head + orjson.dumps(text) + self._tail + meta + self._ids + END

    def _send_calls(self) -> bytes:
        if self.calls_sent or not self.calls:
            return b""
        self.calls_sent = True
        self.parts = [function_call(c[0], c[1], "".join(c[2])) for _, c in sorted(self.calls.items())]
        meta = usage({"completion_tokens": self.output_ids}, self.prompt_ids)
        return event(response(self.id, self.model, list(self.parts), None, meta))
