"""A custom tool call's ``input`` as its arguments stream in: what vLLM's route streams for them.

The engine writes a call to a ``custom`` tool as the arguments ``{"input": "..."}``, delta by delta;
:class:`CustomInput` turns each argument delta into the decoded string it adds (a partial JSON parse,
as vLLM's ``decode_custom_tool_input_prefix``), for :mod:`proxy.dialects.responses_stream` to send as
``response.custom_tool_call_input.delta`` events. What the whole arguments decode to when the call
closes is :func:`proxy.dialects.responses_out.decode_custom_input`.
"""

from __future__ import annotations

import json
import re

from proxy.dialects.responses_out import valid_text

# What a custom tool's arguments look like up to the string they carry, whole and as a stream has them so far.
_HEAD = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_HEAD_SO_FAR = re.compile(r'\s*(?:\{\s*(?:"(?:i(?:n(?:p(?:u(?:t(?:"\s*(?::\s*)?)?)?)?)?)?)?)?)?')
# The longest run of whole JSON string tokens (no quote, no raw control character, no cut escape).
_STRING_TOKENS = re.compile(r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')


class CustomInput:
    """The ``input`` a custom tool call's arguments hold so far, as they stream in: what vLLM's route
    streams for the same argument deltas (its ``decode_custom_tool_input_prefix``, a partial JSON parse).

    The arguments are the model's ``{"input": "..."}``; what streams is the decoded string up to its last
    whole token (trailing whitespace, an escape cut in two and a surrogate pair's first half wait for what
    follows). Text that cannot become such an object any more (a raw control character or a bad escape in
    the string, text after it that is neither another key nor the closing brace) takes back what was sent,
    as there: the engine's parser fails, and its prefix is empty from then on. Each ``feed`` reads only what
    came since the last whole token. What the engine's parser does that this does not: ``input`` after
    other keys streams only when the call closes; a second ``input`` key, or a malformed key or value after
    the string, streams nothing (the engine switches to it, or takes what was sent back); what the call
    closes with is the same.
    """

    __slots__ = ("pending", "state")

    def __init__(self) -> None:
        self.pending = ""  # the arguments not yet read for good: the head, a cut token, what follows the string
        self.state = "head"  # head | string | closed | stuck | other (not {"input": "...)

    def feed(self, piece: str) -> str | None:
        """The decoded text this piece adds ("" for none yet), or None when what was sent can no longer be
        the input's start (the engine's route then streams one empty delta)."""
        text = self.pending + piece
        if self.state == "head":
            match = _HEAD.match(text)
            if match is None:
                if _HEAD_SO_FAR.fullmatch(text) is None:
                    self.state = "other"
                self.pending = text if self.state == "head" else ""
                return ""
            self.state, text = "string", text[match.end() :]
        if self.state == "closed":
            self.pending = text
            return self._after_string()
        if self.state != "string":
            return ""
        seen = len(text.rstrip())  # trailing whitespace waits for what follows it (vLLM's parser strips it)
        stop = _STRING_TOKENS.match(text, 0, seen).end()  # type: ignore[union-attr]  # it matches ""
        end = stop
        decoded = json.loads('"' + text[:end] + '"') if end else ""
        if decoded and "\ud800" <= decoded[-1] <= "\udbff" and text.startswith("\\u", end - 6):
            end -= 6  # a pair's first half: it waits for the second
            decoded = decoded[:-1]
        self.pending = text[end:]
        if stop < seen:
            if text[stop] == '"':  # the string is whole: the rest arrives with the call's end, decoded whole
                self.state, self.pending = "closed", text[stop + 1 :]
                if self._after_string() is None:
                    return None
            elif not (text[stop] == "\\" and _cut_escape(text, stop, seen)):
                self.state = "stuck"
                return None
        return valid_text(decoded)

    def _after_string(self) -> str | None:
        """What follows the closed string: nothing, the closing brace, or another key keep what was sent."""
        tail = self.pending.strip()
        if not tail or tail == "}" or tail == ",":
            return ""
        if tail[0] == "," and tail[1:].lstrip()[0] == '"':
            self.state, self.pending = "other", ""  # another key: nothing more streams until the call closes
            return ""
        self.state, self.pending = "stuck", ""
        return None


# How far back from the end vLLM's partial JSON parser cuts an unterminated string at an escape it
# cannot read yet (partial_json_parser's complete_str): \uXXXX, \UXXXXXXXX and \xXX.
_CUT_WINDOW = {"u": 5, "U": 9, "x": 3}


def _cut_escape(text: str, at: int, end: int) -> bool:
    """Whether the engine's parser, given a string's text up to ``end`` that stops being whole JSON at the
    backslash ``at``, cuts it there (an escape that may yet be completed: it waits) rather than failing on it."""
    j = at
    while j < end:  # escapes as the parser pairs them: a quote not escaped ends the string, and the bad escape
        if text[j] == "\\":  # fails it
            j += 2
        elif text[j] == '"':
            return False
        else:
            j += 1
    last = end - 1 if j > end else end  # a backslash alone at the end: the parser reads up to it
    if last == at:
        return True
    window = _CUT_WINDOW.get(text[at + 1])
    return window is not None and last - at <= window
