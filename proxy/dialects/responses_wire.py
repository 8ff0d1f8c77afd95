"""A Responses stream's output items and item events as bytes, written without dicts.

:mod:`proxy.dialects.responses_out` builds output items as dicts (the non-streamed
reply and the reference); a stream writes the same bytes from templates: each closed
item's text is serialised once, where its three ``.done`` events and the final
``Response`` each serialised it again from a dict. The ``Response`` envelope itself
stays a dict (a C-level copy of a template and one ``orjson.dumps``: a byte template
built in Python measured slower, bench/journal/2026-12-01.md), with the items spliced in as
:class:`orjson.Fragment`. Tests check every event against the openai SDK's own types and, on
the corpus, against the engine's own ``/v1/responses`` stream (tests/proxy/dialects/test_responses_wire.py,
test_responses_stream_oracle.py).
"""

from __future__ import annotations

from typing import Any

import orjson


def js(value: Any) -> bytes:
    """One value as a JSON column writes it (``storage.records.dump_json`` without its fallback)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def text_part(text: bytes, logprobs: bytes = b"[]") -> bytes:
    """:func:`responses_out.text_part` serialised (``text`` and ``logprobs`` already are)."""
    return b'{"type":"output_text","text":%b,"annotations":[],"logprobs":%b}' % (text, logprobs)


def message_item(id_: str, status: str, parts: bytes) -> bytes:
    """:func:`responses_out.message_item` serialised (``parts``: its content parts, comma-joined)."""
    return b'{"id":"%b","type":"message","role":"assistant","status":"%b","content":[%b],"phase":null}' % (
        id_.encode(),
        status.encode(),
        parts,
    )


def function_call_item(
    id_: str, status: str, call_id: Any, name: Any, arguments: bytes, namespace: Any = None
) -> bytes:
    """:func:`responses_out.function_call_item` serialised (``arguments`` already is)."""
    return (
        b'{"id":"%b","type":"function_call","status":"%b","call_id":%b,"name":%b,"arguments":%b,'
        b'"namespace":%b,"caller":null,"async":null}'
    ) % (id_.encode(), status.encode(), js(call_id), js(name), arguments, js(namespace))


def custom_tool_call_item(id_: str, call_id: Any, name: Any, input_: bytes) -> bytes:
    """:func:`responses_out.custom_tool_call_item` serialised (``input_`` already is)."""
    return (
        b'{"id":"%b","type":"custom_tool_call","call_id":%b,"name":%b,"input":%b,'
        b'"namespace":null,"caller":null,"async":null}'
    ) % (id_.encode(), js(call_id), js(name), input_)


def reasoning_item(id_: str, status: str, text: bytes) -> bytes:
    """:func:`responses_out.reasoning_item` serialised (``text`` already is)."""
    return (
        b'{"id":"%b","type":"reasoning","status":"%b","summary":[],"encrypted_content":null,'
        b'"content":[{"type":"reasoning_text","text":%b}]}'
    ) % (id_.encode(), status.encode(), text)
