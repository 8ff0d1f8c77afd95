"""Scrubbing captured CLI requests for the corpus: the CLIs' own prompts out, the structure kept.

Every prompt-like string the CLI wrote itself (Claude Code's ``system`` and system-role
messages and ``<system-reminder>`` blocks, Codex's ``instructions`` and developer messages and
``<environment_context>``-style user turns, every tool's and schema property's
``description``) becomes placeholder text of the same length, line for line, keeping each
line's indent, list marker and enclosing tags. Field names, roles, tool names and schema
shapes are kept. This machine's paths become fixed ones and ids (UUIDs, user ids) fixed
values.
"""

from __future__ import annotations

import json
import re
from typing import Any

FILLER = "Placeholder text standing in for the harness's own prompt, scrubbed. "
_LINE = re.compile(r"^(\s*(?:[-*#>]+\s|\d+\.\s)?(?:<[^<>]{1,60}>)?)(.*?)((?:</?[^<>]{1,60}>)?\s*)$")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX_ID = re.compile(r"\b[0-9a-f]{32,64}\b")


def placeholder(text: str) -> str:
    """The same length and line shape, every word replaced."""
    out = []
    for line in text.split("\n"):
        m = _LINE.match(line)
        head, body, tail = (m.group(1), m.group(2), m.group(3)) if m else ("", line, "")
        out.append(head + (FILLER * (len(body) // len(FILLER) + 1))[: len(body)] + tail)
    return "\n".join(out)


def _descriptions(node: Any) -> Any:
    """A schema or tool with every ``description`` string replaced."""
    if isinstance(node, dict):
        return {
            k: placeholder(v) if k == "description" and isinstance(v, str) else _descriptions(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_descriptions(v) for v in node]
    return node


def _content(content: Any, everything: bool) -> Any:
    """A message's content with the CLI's own text (all of it, or only tagged blocks) replaced."""
    if isinstance(content, str):
        return placeholder(content) if everything or content.lstrip().startswith("<") else content
    if isinstance(content, list):
        out = []
        for block in content:
            text = block.get("text") if isinstance(block, dict) else None
            if isinstance(text, str) and (everything or text.lstrip().startswith("<")):
                block = {**block, "text": placeholder(text)}
            out.append(block)
        return out
    return content


def scrub(body: dict[str, Any], paths: dict[str, str]) -> dict[str, Any]:
    raw = json.dumps(body)
    for real, fixed in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        raw = raw.replace(real, fixed)
    raw = _UUID.sub("00000000-0000-0000-0000-000000000000", raw)
    raw = _HEX_ID.sub(lambda m: "0" * len(m.group(0)), raw)
    body = json.loads(raw)
    body["model"] = "m"
    if "tools" in body:
        body["tools"] = _descriptions(body["tools"])
    if isinstance(body.get("system"), (str, list)):
        body["system"] = _content(body["system"], everything=True)
    if isinstance(body.get("instructions"), str):
        body["instructions"] = placeholder(body["instructions"])
    if isinstance(body.get("metadata"), dict) and "user_id" in body["metadata"]:
        body["metadata"]["user_id"] = "user_placeholder_account_session"
    for key in ("messages", "input"):
        if isinstance(body.get(key), list):
            body[key] = [
                {**m, "content": _content(m["content"], everything=m.get("role") in ("system", "developer"))}
                if isinstance(m, dict) and "content" in m and m.get("role") in ("system", "developer", "user")
                else m
                for m in body[key]
            ]
    return body
