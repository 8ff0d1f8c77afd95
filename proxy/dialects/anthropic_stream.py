"""Anthropic's streaming events, translated chunk by chunk from the engine's chat stream.

One :class:`MessageStream` per call. Each engine chunk goes in as it arrives and the
events it completes come out at once (never buffered to the end):

``message_start`` (first chunk; ``input_tokens`` from the engine's prompt ids) →
per block ``content_block_start``, ``content_block_delta`` (``text_delta`` or
``input_json_delta``), ``content_block_stop`` → ``message_delta`` (stop reason and the
engine's usage, when its usage chunk arrives) → ``message_stop`` (from :meth:`close`,
which the call path sends only after the record is on disk). :meth:`ping` fills long
silences. :attr:`result` is the Message the events add up to (stored as the client's
reply); the anthropic SDK's accumulator builds the same from the events, and it equals
what :func:`proxy.dialects.anthropic.from_chat` makes of the non-streamed reply.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.anthropic_out import message_shell, stop_reason, tool_input, usage
from proxy.dialects.base import DialectStream, StreamEnd

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'


def sse(event: dict[str, Any]) -> bytes:
    """One event as Anthropic frames it: a named SSE event whose data repeats the type."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class MessageStream(DialectStream):
    """The per-stream state machine: the open block, tool-call slots, stop reason, usage."""

    def __init__(self, message_id: str, model: str) -> None:
        self.message = message_shell(message_id, model)  # filled in as events go out
        self.started = False
        self.finished = False  # message_delta sent
        self.open_kind: str | None = None  # "text" | "tool_use": the block now open
        self.parts: list[list[str]] = []  # per block: its text or its argument pieces
        self.tool_blocks: dict[int, int] = {}  # chat tool-call index -> block index
        self.finish_reason: str | None = None
        self.matched: Any = None
        self.output_ids = 0
        self._result: dict[str, Any] | None = None

    @property
    def result(self) -> dict[str, Any] | None:
        """The whole Message once :meth:`close` ran (None before)."""
        return self._result

    def open(self) -> bytes:
        """Nothing before the first chunk: ``message_start`` carries the prompt's token count, known then."""
        return b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events one engine chunk completes (b"" when it completes none)."""
        events: list[bytes] = []
        if not self.started:
            ids = chunk.get("prompt_token_ids")
            if ids is None and chunk.get("choices"):
                ids = chunk["choices"][0].get("prompt_token_ids")
            self._start_message(events, len(ids) if ids else 0)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # Messages has one reply; n > 1 is not part of the API
            self.output_ids += len(choice.get("token_ids") or ())
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.open_kind != "text":
                    self._start(events, {"type": "text", "text": "", "citations": None})
                self.parts[-1].append(delta["content"])
                events.append(self._delta(b"text_delta", b"text", delta["content"]))
            for call in delta.get("tool_calls") or ():
                self._tool_call(events, call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
        if chunk.get("usage") is not None and not chunk.get("choices") and self.finish_reason is not None:
            self._finish(events, chunk["usage"])
        return b"".join(events)

    def close(self, end: StreamEnd | None = None) -> bytes:
        """The closing events: whatever is still open, then ``message_stop``.

        ``end`` (the serving path's StreamEnd) carries the chat usage when the engine's usage
        chunk never came (else the token ids seen so far are the output count). A stream that
        failed (engine error, timeout) ends as Anthropic's do: an ``error`` event, no
        ``message_stop``; the SDK raises it.
        """
        events: list[bytes] = []
        if not self.started:
            self._start_message(events, 0)
        if end is not None and end.error is not None:
            self._stop([])  # fold what was streamed into the result; the client gets the error next
            kind = "timeout_error" if end.termination == "timeout" else "api_error"
            events.append(sse({"type": "error", "error": {"type": kind, "message": end.error}}))
        else:
            if not self.finished:
                self._finish(events, (end.usage if end else None) or {"completion_tokens": self.output_ids})
            events.append(sse({"type": "message_stop"}))
        self._result = self.message
        return b"".join(events)

    def ping(self) -> bytes:
        """A keep-alive event for a long silence (clients and SDKs skip it)."""
        return PING

    def _start_message(self, events: list[bytes], input_tokens: int) -> None:
        self.started = True
        self.message["usage"]["input_tokens"] = input_tokens
        start = {**self.message, "content": [], "usage": dict(self.message["usage"])}
        events.append(sse({"type": "message_start", "message": start}))

    def _tool_call(self, events: list[bytes], call: dict[str, Any]) -> None:
        slot = call.get("index", 0)
        fn = call.get("function") or {}
        if slot not in self.tool_blocks:
            tool_id = call.get("id") or f"toolu_{self.message['id']}_{slot}"
            self._start(events, {"type": "tool_use", "id": tool_id, "name": fn.get("name") or "", "input": {}})
            self.tool_blocks[slot] = len(self.parts) - 1
        index = self.tool_blocks[slot]
        # A delta for an earlier, closed call cannot be expressed in the Messages API; vLLM never sends one.
        if fn.get("arguments") and index == len(self.parts) - 1:
            self.parts[index].append(fn["arguments"])
            events.append(self._delta(b"input_json_delta", b"partial_json", fn["arguments"]))

    def _start(self, events: list[bytes], block: dict[str, Any]) -> None:
        self._stop(events)
        self.open_kind = block["type"]
        self.parts.append([])
        self.message["content"].append(dict(block))
        events.append(sse({"type": "content_block_start", "index": len(self.parts) - 1, "content_block": block}))

    def _stop(self, events: list[bytes]) -> None:
        if self.open_kind is None:
            return
        index = len(self.parts) - 1
        block = self.message["content"][index]
        if self.open_kind == "text":
            block["text"] = "".join(self.parts[index])
        else:
            block["input"] = tool_input("".join(self.parts[index]))
        events.append(sse({"type": "content_block_stop", "index": index}))
        self.open_kind = None

    def _delta(self, kind: bytes, field: bytes, value: str) -> bytes:
        # The one event per token: a byte template instead of a dict through orjson (the same bytes).
        return (
            DELTA_HEAD
            + str(len(self.parts) - 1).encode()
            + b',"delta":{"type":"'
            + kind
            + b'","'
            + field
            + b'":'
            + orjson.dumps(value)
            + b"}}\n\n"
        )

    def _finish(self, events: list[bytes], chat_usage: dict[str, Any]) -> None:
        if not self.parts:  # an empty reply is one empty text block, as the non-streamed Message has
            self._start(events, {"type": "text", "text": "", "citations": None})
        self._stop(events)
        reason, sequence = stop_reason(self.finish_reason, self.matched, bool(self.tool_blocks))
        out_usage = usage(chat_usage)
        if not chat_usage.get("prompt_tokens"):
            out_usage["input_tokens"] = self.message["usage"]["input_tokens"]  # message_start's count stands
        keys = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        delta = {"stop_reason": reason, "stop_sequence": sequence, "stop_details": None}
        events.append(sse({"type": "message_delta", "delta": delta, "usage": {k: out_usage[k] for k in keys}}))
        self.message.update(stop_reason=reason, stop_sequence=sequence, usage=out_usage)
        self.finished = True
