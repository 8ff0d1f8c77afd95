"""The Responses stream translator as it was before its events were written from byte templates
(``proxy/dialects/responses_stream.py`` at 146ae58): every event a dict through orjson.

Kept as the reference the byte templates must match byte for byte (test_responses_wire.py);
not used by the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.dialects.base import DialectStream, Exchange, StreamEnd, sse
from proxy.dialects.responses_out import (
    envelope,
    finish,
    function_call_item,
    item_id,
    logprobs_out,
    message_item,
    reasoning_item,
    text_part,
)
from proxy.errors import ApiError
from storage.records import dump_json

TEXT_DELTA = "response.output_text.delta"
NO_LOGPROBS = b',"logprobs":[]'
TERMINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


@dataclass
class _Item:
    kind: str  # message | function_call | reasoning
    id: str
    index: int  # output_index
    tool_index: int | None = None
    call_id: str = ""
    name: str = ""
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    heads: dict[str, bytes] = field(default_factory=dict)  # per delta kind: the event's bytes up to its delta


class DictStream(DialectStream):
    """One call's Responses events; ``feed`` never waits and never holds an event back."""

    def __init__(self, ex: Exchange, logprobs: bool) -> None:
        self.ex = ex
        self.logprobs = logprobs
        self.top = int(ex.request.get("top_logprobs") or 0)
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.current: _Item | None = None
        self.finish_reason: str | None = None
        self._result: dict[str, Any] | None = None

    @property
    def result(self) -> dict[str, Any] | None:
        return self._result

    def _event(self, kind: str, **data: Any) -> bytes:
        data["type"] = kind
        data["sequence_number"] = self.seq
        self.seq += 1
        return sse(kind, data)

    def open(self) -> bytes:
        start = orjson.Fragment(orjson.dumps(envelope(self.ex, "in_progress", [])))  # serialised once for both
        return self._event("response.created", response=start) + self._event("response.in_progress", response=start)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices")
        if not choices:
            return b""  # the usage chunk: its numbers reach close() through the end
        out: list[bytes] = []
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue  # Responses has no n > 1
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if content:  # the common case first: one text token
                    cur = self.current
                    if cur is None or cur.kind != "message":
                        out += self._switch("message")
                        cur = self.current
                        assert cur is not None
                    if self.logprobs:
                        lps = logprobs_out(choice.get("logprobs"), self.top)
                        cur.logprobs += lps
                        out.append(self._delta(TEXT_DELTA, content, b',"logprobs":' + orjson.dumps(lps)))
                    else:
                        out.append(self._delta(TEXT_DELTA, content, NO_LOGPROBS))
                if len(delta) > 1 or not content:  # anything else in it: reasoning, tool calls
                    out += self._other_delta(delta)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                out += self._close_item("incomplete" if self.finish_reason == "length" else "completed")
        return b"".join(out)

    def _other_delta(self, delta: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            out += self._switch("reasoning")
            out.append(self._delta("response.reasoning_text.delta", reasoning))
        for call in delta.get("tool_calls") or ():
            out += self._call_delta(call)
        return out

    def close(self, end: StreamEnd) -> bytes:
        out = self._close_item("incomplete")  # still open: the stream broke off
        response = envelope(self.ex, "in_progress", self.items)
        finish(response, end.termination, end.usage, end.error)
        self._result, self.result_json = response, dump_json(response)  # serialised once: event and record
        out.append(self._event(TERMINAL_EVENT[response["status"]], response=orjson.Fragment(self.result_json)))
        return b"".join(out)

    def fail(self, exc: ApiError) -> bytes:
        """Responses' ``error`` event (its fields at the top level, unlike the JSON error envelope)."""
        return self._event("error", code=exc.code or exc.type, message=exc.message, param=exc.param)

    # ------------------------------------------------------------------ items

    def _switch(self, kind: str, tool_index: int | None = None) -> list[bytes]:
        """Close the open item unless it is the one this delta belongs to, and open that one."""
        cur = self.current
        if cur is not None and cur.kind == kind and cur.tool_index == tool_index:
            return []
        out = self._close_item("completed")
        prefix = {"message": "msg_", "function_call": "fc_", "reasoning": "rs_"}[kind]
        cur = self.current = _Item(kind, item_id(prefix), len(self.items), tool_index)
        if kind == "message":
            out.append(
                self._event(
                    "response.output_item.added", output_index=cur.index, item=message_item(cur.id, "in_progress", [])
                )
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    output_index=cur.index,
                    item_id=cur.id,
                    content_index=0,
                    part=text_part(""),
                )
            )
        elif kind == "reasoning":
            out.append(
                self._event(
                    "response.output_item.added", output_index=cur.index, item=reasoning_item(cur.id, "in_progress", "")
                )
            )
        return out

    def _call_delta(self, call: dict[str, Any]) -> list[bytes]:
        fn = call.get("function") or {}
        index = call.get("index", 0)
        cur = self.current
        out: list[bytes] = []
        if cur is None or cur.kind != "function_call" or cur.tool_index != index:
            out += self._switch("function_call", index)
            cur = self.current
            assert cur is not None
            cur.call_id = call.get("id") or item_id("call_")
            cur.name = fn.get("name") or ""
            item = function_call_item(cur.id, "in_progress", cur.call_id, cur.name, "")
            out.append(self._event("response.output_item.added", output_index=cur.index, item=item))
        if fn.get("arguments"):
            out.append(self._delta("response.function_call_arguments.delta", fn["arguments"]))
        return out

    def _delta(self, kind: str, text: str, extra: bytes = b"") -> bytes:
        """One delta event of the open item, from a per-item template: the one event most engine
        chunks become, so built without a dict (about half the cost of :meth:`_event`)."""
        cur = self.current
        assert cur is not None
        cur.text.append(text)
        head = cur.heads.get(kind)
        if head is None:
            where = b"" if kind == "response.function_call_arguments.delta" else b',"content_index":0'
            name = kind.encode()
            head = cur.heads[kind] = (
                b"event: "
                + name
                + b'\ndata: {"type":"'
                + name
                + b'","item_id":"'
                + cur.id.encode()
                + b'","output_index":'
                + str(cur.index).encode()
                + where
                + b',"delta":'
            )
        seq, self.seq = self.seq, self.seq + 1
        return head + orjson.dumps(text) + extra + b',"sequence_number":' + str(seq).encode() + b"}\n\n"

    def _close_item(self, status: str) -> list[bytes]:
        cur, self.current = self.current, None
        if cur is None:
            return []
        text = "".join(cur.text)
        out: list[bytes] = []
        if cur.kind == "message":
            part = text_part(text, cur.logprobs)
            out.append(
                self._event(
                    "response.output_text.done",
                    output_index=cur.index,
                    item_id=cur.id,
                    content_index=0,
                    text=text,
                    logprobs=cur.logprobs,
                )
            )
            out.append(
                self._event(
                    "response.content_part.done", output_index=cur.index, item_id=cur.id, content_index=0, part=part
                )
            )
            item = message_item(cur.id, status, [part])
        elif cur.kind == "reasoning":
            out.append(
                self._event(
                    "response.reasoning_text.done", output_index=cur.index, item_id=cur.id, content_index=0, text=text
                )
            )
            item = reasoning_item(cur.id, status, text)
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    output_index=cur.index,
                    item_id=cur.id,
                    name=cur.name,
                    arguments=text,
                )
            )
            item = function_call_item(cur.id, status, cur.call_id, cur.name, text)
        self.items.append(item)
        out.append(self._event("response.output_item.done", output_index=cur.index, item=item))
        return out
