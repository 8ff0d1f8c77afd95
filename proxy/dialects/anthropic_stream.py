"""Anthropic's streaming events, translated chunk by chunk from the engine's chat stream.

One :class:`MessageStream` per call. Each engine chunk goes in as it arrives and the
events it completes come out at once (never buffered to the end):

``message_start`` (first chunk; ``input_tokens`` from the engine's prompt ids) →
per block ``content_block_start``, ``content_block_delta`` (``text_delta`` or
``input_json_delta``), ``content_block_stop`` → ``message_delta`` (stop reason and the
engine's usage, when its usage chunk arrives) → ``message_stop`` (from :meth:`end`, which
the call path sends only after the record is on disk). :meth:`ping` fills long silences.

The event sequence, accumulated by the anthropic SDK, equals the non-streamed
Message that :func:`proxy.dialects.anthropic.from_chat` builds for the same reply.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.anthropic import message_shell, stop_reason, usage

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def sse(event: dict[str, Any]) -> bytes:
    """One event as Anthropic frames it: a named SSE event whose data repeats the type."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class MessageStream:
    """The per-stream state machine: open block, tool-call ids, stop reason, usage."""

    def __init__(self, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model
        self.started = False
        self.finished = False  # message_delta sent
        self.index = -1  # the content block now open (-1: none yet)
        self.open: str | None = None  # "text" | "tool_use" | None
        self.blocks = 0
        self.tool_blocks: dict[int, int] = {}  # chat tool-call index -> block index
        self.finish_reason: str | None = None
        self.matched: Any = None
        self.output_ids = 0

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events one engine chunk completes (b"" when it completes none)."""
        events: list[dict[str, Any]] = []
        if not self.started:
            self.started = True
            start = message_shell(self.message_id, self.model)
            ids = chunk.get("prompt_token_ids")
            if ids is None and chunk.get("choices"):
                ids = chunk["choices"][0].get("prompt_token_ids")
            start["usage"]["input_tokens"] = len(ids) if ids else 0
            events.append({"type": "message_start", "message": start})
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # Messages has one reply; n > 1 is not part of the API
            self.output_ids += len(choice.get("token_ids") or ())
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.open != "text":
                    self._start(events, {"type": "text", "text": "", "citations": None}, "text")
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                self._tool_call(events, call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.matched = choice.get("stop_reason")
        if chunk.get("usage") is not None and not chunk.get("choices") and self.finish_reason is not None:
            self._finish(events, chunk["usage"])
        return b"".join(sse(e) for e in events)

    def end(self) -> bytes:
        """The closing events: whatever is still open, then ``message_stop``."""
        events: list[dict[str, Any]] = []
        if not self.started:
            events += [{"type": "message_start", "message": message_shell(self.message_id, self.model)}]
            self.started = True
        if not self.finished:
            self._finish(events, {"completion_tokens": self.output_ids})
        events.append({"type": "message_stop"})
        return b"".join(sse(e) for e in events)

    def ping(self) -> bytes:
        return PING

    def _tool_call(self, events: list[dict[str, Any]], call: dict[str, Any]) -> None:
        slot = call.get("index", 0)
        fn = call.get("function") or {}
        if slot not in self.tool_blocks:
            block: dict[str, Any] = {"type": "tool_use", "id": call.get("id") or f"toolu_{self.message_id}_{slot}",
                     "name": fn.get("name") or "", "input": {}}  # fmt: skip
            self._start(events, block, "tool_use")
            self.tool_blocks[slot] = self.index
        if fn.get("arguments"):
            index = self.tool_blocks[slot]
            if index != self.index:  # the engine went back to an earlier call: not in the Messages API
                return
            events.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))

    def _start(self, events: list[dict[str, Any]], block: dict[str, Any], kind: str) -> None:
        self._stop(events)
        self.index = self.blocks
        self.blocks += 1
        self.open = kind
        events.append({"type": "content_block_start", "index": self.index, "content_block": block})

    def _stop(self, events: list[dict[str, Any]]) -> None:
        if self.open is not None:
            events.append({"type": "content_block_stop", "index": self.index})
            self.open = None

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _finish(self, events: list[dict[str, Any]], chat_usage: dict[str, Any]) -> None:
        if self.blocks == 0:  # an empty reply is one empty text block, as the non-streamed Message has
            self._start(events, {"type": "text", "text": "", "citations": None}, "text")
        self._stop(events)
        reason, sequence = stop_reason(self.finish_reason, self.matched, bool(self.tool_blocks))
        out_usage = usage(chat_usage)
        delta_usage = {k: out_usage[k] for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                                                  "cache_read_input_tokens", "server_tool_use")}  # fmt: skip
        if not chat_usage.get("prompt_tokens"):
            delta_usage.pop("input_tokens")  # unknown here: message_start's count stands
        events.append({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence,
                                                          "stop_details": None}, "usage": delta_usage})  # fmt: skip
        self.finished = True
