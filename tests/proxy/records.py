"""Call records as ``ProxiedCall.save`` writes them, for the spool and recorder tests.

JSON nulls, a NUL escaped inside JSON text (models emit it), non-ASCII text,
integers and floats; ``over`` replaces any field, JSON ones given as Python values.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from storage.records import JSON_FIELDS, CallRecord, dump_json


def record(i: int, *, session: str | None = None, **over: Any) -> CallRecord:
    cid = over.pop("id", None) or f"cmpl-{uuid.uuid4().hex}"
    values: dict[str, Any] = {
        "id": cid,
        "project_id": "p",
        "session_id": session or f"ses_{i}",
        "task_id": "t1" if i % 2 else None,
        "client_request_id": f"req-{i}",
        "upstream_id": f"chatcmpl-{i}",
        "endpoint": "chat",
        "alias": "support",
        "served_model": "support@v2",
        "adapter_version": 2 if i % 2 else None,
        "tags": ["a", "ü"],
        "request": {"model": "support", "messages": [{"role": "user", "content": f"héllo\u0000 {i}"}], "n": 1},
        "response": None if i % 3 == 0 else {"id": cid, "choices": [{"message": {"content": "✓ ok"}}]},
        "prompt_token_ids": [1, 2, 3 + i],
        "choices": [
            {
                "index": 0,
                "token_ids": [7, 8],
                "logprobs": [-0.25, -1.5e-9],
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok\u0000"},
            }
        ],
        "sampling": {"temperature": 0.7, "top_p": 1.0, "n": 1},
        "usage": None if i % 2 else {"total_tokens": 5},
        "status_code": 200,
        "termination": "stop",
        "error": None if i % 2 else "partial: ¿?",
        "stream": bool(i % 2),
        "link_key": "ab" * 32,
        "parent_id": None,
        "created_at": datetime(2026, 11, 30, 12, i // 60 % 60, i % 60, 1234, UTC).isoformat(),
        "latency_ms": 12.5 + i,
        "ttft_ms": None if i % 2 else 3.25,
        "dialect": "responses" if i % 2 else "chat",
        "client_request": {"input": f"héllo {i}"} if i % 2 else None,
        "client_response": {"output": [{"type": "message"}]} if i % 2 else None,
        "session_source": "header",
    }
    values.update(over)
    for name in JSON_FIELDS:
        values[name] = dump_json(values[name])
    return CallRecord(**values)
