"""Redaction reaches token ids: a masked secret must not survive as the ids that spell it.

Sampled tokens map to text through the per-token pieces the engine returns with
logprobs (chat: ``logprobs.content[i].bytes``, completions: ``logprobs.tokens``;
the proxy always asks for them). The pieces are joined, the project's patterns run
over that text, and every token whose bytes overlap a match has its id replaced
by :data:`REDACTED_ID`, its logprob kept (it is a number, not text). The choice
records how many (``redacted``); storage flags its trajectory ``redacted`` and the
trainer excludes it, since the sequence no longer is what was sampled.

Without usable pieces (absent, or not one per token) a choice whose text matched
loses all its ids: fail closed. Prompt ids are treated the same way for now: a
request whose text matched a pattern is stored without prompt ids (every choice
says ``redacted_prompt``), so no id spelling the secret is kept; mapping prompt ids
to text needs the engine's tokenizer, which the proxy does not load.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

REDACTED_ID = -1  # never a vocabulary id


def piece_bytes(pieces: Sequence[Any] | None, n: int) -> list[bytes] | None:
    """The bytes of each of ``n`` sampled tokens, from the engine's per-token logprob entries; None if unusable."""
    if pieces is None or len(pieces) != n:
        return None
    out = []
    for piece in pieces:
        if isinstance(piece, str):  # completions: the token's text
            out.append(piece.encode("utf-8", "surrogatepass"))
        elif isinstance(piece, dict) and isinstance(piece.get("bytes"), list):  # chat: its UTF-8 bytes
            out.append(bytes(piece["bytes"]))
        elif isinstance(piece, dict) and isinstance(piece.get("token"), str):
            out.append(piece["token"].encode("utf-8", "surrogatepass"))
        else:
            return None
    return out


def matched_tokens(pieces: Sequence[bytes], patterns: Sequence[re.Pattern[str]]) -> list[int]:
    """Indices of the tokens whose bytes overlap a match of any pattern in the text they spell together."""
    joined = b"".join(pieces)
    text = joined.decode("utf-8", "surrogateescape")  # an undecodable byte stays one character
    spans = [m.span() for p in patterns for m in p.finditer(text) if m.end() > m.start()]
    if not spans:
        return []
    starts = [0]  # byte offset where each character starts (plus the end)
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8", "surrogateescape")))
    hit = [(starts[a], starts[b]) for a, b in spans]
    out, offset = [], 0
    for i, piece in enumerate(pieces):
        end = offset + len(piece)
        if any(a < end and offset < b for a, b in hit):
            out.append(i)
        offset = end
    return out


def redact_choice(choice: dict[str, Any], patterns: Sequence[re.Pattern[str]], text: str | None) -> list[int]:
    """Mask the ids of ``choice``'s sampled tokens that spell a match, in place; returns their indices.

    ``text``: the choice's text before redaction, judged when the pieces are unusable.
    """
    ids = choice.get("token_ids")
    pieces = choice.pop("pieces", None)
    if not ids:
        return []
    quick = _token_text(pieces, len(ids))
    if quick is not None and not any(p.search(quick) for p in patterns):
        return []  # the tokens' own text spells no match: nothing to find byte by byte
    spelled = piece_bytes(pieces, len(ids))
    if spelled is None:
        if text is None or not any(p.search(text) for p in patterns):
            return []
        positions = list(range(len(ids)))  # cannot tell which tokens: none is kept
    else:
        positions = matched_tokens(spelled, patterns)
    if positions:
        masked = list(ids)
        for i in positions:
            masked[i] = REDACTED_ID
        choice["token_ids"] = masked
        choice["redacted"] = len(positions)
    return positions


def _token_text(pieces: Sequence[Any] | None, n: int) -> str | None:
    """The text the pieces spell when each is whole characters (the common case); None when unsure."""
    if not pieces or len(pieces) != n:
        return None
    try:
        text = "".join([p["token"] for p in pieces] if isinstance(pieces[0], dict) else pieces)
    except (KeyError, TypeError):
        return None
    return None if "bytes:" in text else text  # vLLM's form for a partial character: go byte by byte


def mask_logprob_entries(response: Any, index: int, positions: Sequence[int]) -> None:
    """In a stored reply, blank the logprob entries (token, bytes, alternatives) of redacted positions."""
    if not isinstance(response, dict) or not positions:
        return
    for choice in response.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != index:
            continue
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            continue
        content = lp.get("content")
        if isinstance(content, list):
            for i in positions:
                if i < len(content) and isinstance(content[i], dict):
                    content[i] = {**content[i], "token": "[redacted]", "bytes": None, "top_logprobs": []}
        tokens = lp.get("tokens")
        if isinstance(tokens, list):
            for i in positions:
                if i < len(tokens):
                    tokens[i] = "[redacted]"
            top = lp.get("top_logprobs")
            if isinstance(top, list):
                for i in positions:
                    if i < len(top):
                        top[i] = {}
