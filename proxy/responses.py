"""A JSON response rendered by orjson (datetimes included); FastAPI's own is deprecated."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
