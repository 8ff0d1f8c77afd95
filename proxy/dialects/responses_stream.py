"""A Responses stream, translated event by event from the engine's chat chunks.

The state machine has at most one open output item (reasoning, a message, or one
function or custom tool call). A chunk whose delta belongs to another item closes the open one (its
``.done`` events and ``response.output_item.done``) and opens the next
(``response.output_item.added``, and ``response.content_part.added`` for a message).
The engine's finish reason closes the last item at once; the terminal event
(``response.completed``, ``response.incomplete`` or ``response.failed``, carrying the
whole response with usage) waits for :meth:`ResponsesStream.close`, which the serving
path calls after the record is on disk.

Events are written as bytes, the ones orjson made of the dicts this once built: each
text delta from a per-item ``%`` template, each item's events from
:mod:`proxy.dialects.responses_wire` (its text serialised once for the three ``.done``
events and the final ``Response`` that repeat it).

A call to a ``custom`` tool streams as vLLM's route streams it: the engine's argument deltas
(``{"input": "...`` as they grow) become ``response.custom_tool_call_input.delta`` events of the
decoded string so far (:class:`proxy.dialects.responses_custom_input.CustomInput`), and at the end
whatever the whole arguments decode to and was not yet sent (all of it again, when it is not an
extension of what was), then ``response.custom_tool_call_input.done`` with the ``input``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.dialects.base import DialectStream, Exchange, StreamEnd, sse
from proxy.dialects.responses_custom_input import CustomInput
from proxy.dialects.responses_out import (
    custom_names,
    decode_custom_input,
    envelope,
    event_logprobs,
    finish,
    item_id,
    logprobs_out,
    namespaced_names,
)
from proxy.dialects.responses_wire import (
    custom_tool_call_item,
    function_call_item,
    js,
    message_item,
    reasoning_item,
    text_part,
)
from proxy.errors import ApiError
from storage.records import dump_json

TEXT_DELTA = "response.output_text.delta"
ARGUMENTS_DELTA = "response.function_call_arguments.delta"
CUSTOM_DELTA = "response.custom_tool_call_input.delta"
CALLS = ("function_call", "custom_tool_call")
NO_LOGPROBS = b',"logprobs":[]'
TERMINAL_EVENT = {
    "completed": b"response.completed",
    "incomplete": b"response.incomplete",
    "failed": b"response.failed",
}
PREFIX = {"message": "msg_", "function_call": "fc_", "custom_tool_call": "ctc_", "reasoning": "rs_"}
EVENT = b'event: %b\ndata: {%b,"type":"%b","sequence_number":%d}\n\n'
EMPTY = b'""'


@dataclass
class _Item:
    kind: str  # message | function_call | custom_tool_call | reasoning
    id: str
    index: int  # output_index
    tool_index: int | None = None
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    heads: dict[str, bytes] = field(default_factory=dict)  # per delta kind: its event as a % template
    custom: CustomInput | None = None  # a custom tool call's input as it streams
    sent: list[str] = field(default_factory=list)  # the input deltas sent since the last empty one

    def where(self) -> bytes:
        """The ``output_index`` and ``item_id`` fields most of its events start with."""
        return b'"output_index":' + str(self.index).encode() + b',"item_id":"' + self.id.encode() + b'"'


class ResponsesStream(DialectStream):
    """One call's Responses events; ``feed`` never waits and never holds an event back."""

    def __init__(self, ex: Exchange, logprobs: bool) -> None:
        self.ex = ex
        self.logprobs = logprobs
        self.top = int(ex.request.get("top_logprobs") or 0)
        self.seq = 0
        self.items: list[bytes] = []  # the output items closed so far, serialised
        self.current: _Item | None = None
        self.finish_reason: str | None = None
        self._result: dict[str, Any] | None = None
        tools = ex.request.get("tools")
        self.names = namespaced_names(tools) if tools else {}  # flat name -> (namespace, name)
        self.custom = custom_names(tools) if tools else frozenset()  # calls to these are custom tool calls

    @property
    def result(self) -> dict[str, Any] | None:
        """The whole ``Response`` once :meth:`close` ran (parsed from its bytes when asked)."""
        if self._result is None and self.result_json is not None:
            self._result = orjson.loads(self.result_json)
        return self._result

    def _event(self, kind: bytes, data: bytes) -> bytes:
        """An event whose data is ``{<data>,"type":kind,"sequence_number":n}``: the field order of the
        dicts the events were once built from (their fields, then ``type`` and ``sequence_number``)."""
        seq, self.seq = self.seq, self.seq + 1
        return EVENT % (kind, data, kind, seq)

    def open(self) -> bytes:
        start = b'"response":' + orjson.dumps(envelope(self.ex, "in_progress", []))  # serialised once for both
        return self._event(b"response.created", start) + self._event(b"response.in_progress", start)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices")
        if not choices:
            return b""  # the usage chunk: its numbers reach close() through the end
        out = b""  # one event, most chunks: no list to join
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue  # Responses has no n > 1
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                other = len(delta) > 1 or not content  # anything beside one text token: reasoning, tool calls
                reasoning = other and (delta.get("reasoning") or delta.get("reasoning_content"))
                if reasoning:  # first, as vLLM's route splits a delta: reasoning, then text, then tool calls
                    out += b"".join(self._switch("reasoning"))
                    out += self._delta("response.reasoning_text.delta", reasoning)
                if content:  # the common case: one text token
                    cur = self.current
                    if cur is None or cur.kind != "message":
                        out += b"".join(self._switch("message"))
                        cur = self.current
                        assert cur is not None
                    if self.logprobs:
                        lps = logprobs_out(choice.get("logprobs"), self.top)
                        cur.logprobs += lps
                        out += self._delta(TEXT_DELTA, content, b',"logprobs":' + orjson.dumps(event_logprobs(lps)))
                    else:
                        out += self._delta(TEXT_DELTA, content, NO_LOGPROBS)
                if other:
                    for call in delta.get("tool_calls") or ():
                        out += b"".join(self._call_delta(call))
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                out += b"".join(self._close_item("incomplete" if self.finish_reason == "length" else "completed"))
        return out

    def close(self, end: StreamEnd) -> bytes:
        out = self._close_item("incomplete")  # still open: the stream broke off
        output = b"[" + b",".join(self.items) + b"]"
        response = envelope(self.ex, "in_progress", orjson.Fragment(output))
        finish(response, end.termination, end.usage, end.error)
        try:  # serialised once: the terminal event and the record
            self.result_json = js(response)
        except orjson.JSONEncodeError:  # an integer past 64 bits in the usage: as dump_json writes the dict
            response["output"] = orjson.loads(output)
            self.result_json = dump_json(response)
        out.append(self._event(TERMINAL_EVENT[response["status"]], b'"response":' + self.result_json))
        return b"".join(out)

    def fail(self, exc: ApiError) -> bytes:
        """Responses' ``error`` event (its fields at the top level, unlike the JSON error envelope)."""
        data = {
            "code": exc.code or exc.type,
            "message": exc.message,
            "param": exc.param,
            "type": "error",
            "sequence_number": self.seq,
        }
        self.seq += 1
        return sse("error", data)

    # ------------------------------------------------------------------ items

    def _switch(self, kind: str, tool_index: int | None = None) -> list[bytes]:
        """Close the open item unless it is the one this delta belongs to, and open that one."""
        cur = self.current
        if cur is not None and cur.kind == kind and cur.tool_index == tool_index:
            return []
        out = self._close_item("completed")
        cur = self.current = _Item(kind, item_id(PREFIX[kind]), len(self.items), tool_index)
        index = b'"output_index":' + str(cur.index).encode()
        if kind == "message":
            out.append(
                self._event(
                    b"response.output_item.added", index + b',"item":' + message_item(cur.id, "in_progress", b"")
                )
            )
            out.append(
                self._event(
                    b"response.content_part.added", cur.where() + b',"content_index":0,"part":' + text_part(EMPTY)
                )
            )
        elif kind == "reasoning":
            out.append(
                self._event(
                    b"response.output_item.added", index + b',"item":' + reasoning_item(cur.id, "in_progress", EMPTY)
                )
            )
        return out

    def _call_delta(self, call: dict[str, Any]) -> list[bytes]:
        fn = call.get("function") or {}
        index = call.get("index", 0)
        cur = self.current
        out: list[bytes] = []
        if cur is None or cur.kind not in CALLS or cur.tool_index != index:
            name = fn.get("name") or ""
            kind = "custom_tool_call" if name in self.custom else "function_call"
            out += self._switch(kind, index)
            cur = self.current
            assert cur is not None
            cur.call_id = call.get("id") or item_id("call_")
            cur.name = name
            if kind == "custom_tool_call":
                cur.custom = CustomInput()
                item = custom_tool_call_item(cur.id, cur.call_id, cur.name, EMPTY)
            else:
                if cur.name in self.names:
                    cur.namespace, cur.name = self.names[cur.name]
                item = function_call_item(cur.id, "in_progress", cur.call_id, cur.name, EMPTY, cur.namespace)
            out.append(
                self._event(
                    b"response.output_item.added", b'"output_index":' + str(cur.index).encode() + b',"item":' + item
                )
            )
        arguments = fn.get("arguments")
        if arguments:
            if cur.custom is None:
                out.append(self._delta(ARGUMENTS_DELTA, arguments))
            else:
                cur.text.append(arguments)  # the arguments as the model wrote them; the events carry the input
                out += self._input_delta(cur, cur.custom.feed(arguments))
        return out

    def _input_delta(self, cur: _Item, decoded: str | None) -> list[bytes]:
        """A custom call's input delta: the text decoded since the last one, or (None) an empty delta that
        takes back what was sent when the arguments stopped being a string's start (the engine's rule)."""
        if decoded is None:
            if not cur.sent:
                return []
            cur.sent.clear()
            return [self._delta(CUSTOM_DELTA, "", keep=False)]
        if not decoded:
            return []
        cur.sent.append(decoded)
        return [self._delta(CUSTOM_DELTA, decoded, keep=False)]

    def _delta(self, kind: str, text: str, extra: bytes = b"", keep: bool = True) -> bytes:
        """One delta event of the open item, from a per-item template (one ``%`` format): the one event
        most engine chunks become. ``keep``: the item's text is what its deltas add up to (not so for a
        custom call, whose item keeps the arguments its input is decoded from)."""
        cur = self.current
        assert cur is not None
        if keep:
            cur.text.append(text)
        template = cur.heads.get(kind)
        if template is None:
            where = b"" if kind in (ARGUMENTS_DELTA, CUSTOM_DELTA) else b',"content_index":0'
            name = kind.encode()
            head = (
                b"event: "
                + name
                + b'\ndata: {"type":"'
                + name
                + b'","item_id":"'
                + cur.id.encode()
                + b'","output_index":'
                + str(cur.index).encode()
                + where
            )
            template = cur.heads[kind] = head.replace(b"%", b"%%") + b',"delta":%b%b,"sequence_number":%d}\n\n'
        seq = self.seq
        self.seq = seq + 1
        return template % (orjson.dumps(text), extra, seq)

    def _close_item(self, status: str) -> list[bytes]:
        cur = self.current
        if cur is None:
            return []
        out: list[bytes] = []
        if cur.custom is not None:  # the input the whole arguments decode to, less what was sent of it
            input_ = decode_custom_input("".join(cur.text))
            sent = "".join(cur.sent)
            if input_ != sent:
                out.append(
                    self._delta(CUSTOM_DELTA, input_[len(sent) :] if input_.startswith(sent) else input_, keep=False)
                )
            cur.text = [input_]
        self.current = None
        text = js("".join(cur.text))  # serialised once: the .done events and the item repeat it
        where = cur.where()
        if cur.kind == "message":
            logprobs = js(cur.logprobs)
            part = text_part(text, logprobs)
            done_lps = js(event_logprobs(cur.logprobs)) if cur.logprobs else logprobs
            done = where + b',"content_index":0,"text":' + text + b',"logprobs":' + done_lps
            out.append(self._event(b"response.output_text.done", done))
            out.append(self._event(b"response.content_part.done", where + b',"content_index":0,"part":' + part))
            item = message_item(cur.id, status, part)
        elif cur.kind == "reasoning":
            out.append(self._event(b"response.reasoning_text.done", where + b',"content_index":0,"text":' + text))
            item = reasoning_item(cur.id, status, text)
        elif cur.kind == "custom_tool_call":
            out.append(self._event(b"response.custom_tool_call_input.done", where + b',"input":' + text))
            item = custom_tool_call_item(cur.id, cur.call_id, cur.name, text)
        else:
            out.append(
                self._event(
                    b"response.function_call_arguments.done",
                    where + b',"name":' + js(cur.name) + b',"arguments":' + text,
                )
            )
            item = function_call_item(cur.id, status, cur.call_id, cur.name, text, cur.namespace)
        self.items.append(item)
        out.append(
            self._event(b"response.output_item.done", b'"output_index":' + str(cur.index).encode() + b',"item":' + item)
        )
        return out
