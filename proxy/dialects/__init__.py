"""Dialects served at the edge and translated to chat completions; see :mod:`proxy.dialects.base`."""

from __future__ import annotations

from proxy.dialects.anthropic import AnthropicDialect
from proxy.dialects.base import Dialect
from proxy.dialects.gemini import GeminiDialect
from proxy.dialects.responses import ResponsesDialect

# Stateless translators, one per client API; the serving path matches their paths.
DIALECTS: tuple[Dialect, ...] = (ResponsesDialect(), AnthropicDialect(), GeminiDialect())  # Gemini's: by pattern
ROUTES: dict[str, Dialect] = {path: d for d in DIALECTS for path in d.paths}
