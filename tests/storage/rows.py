"""Hand-built completion rows (the columns the proxy records) and a tiny ChatML-like vocabulary.

Vocabulary: 1 = <start>, 2 = <end> (end of turn), 3 = newline; roles 10 user,
12 assistant, 13 tool, 14 system; everything else is content.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from storage.models import Completion, Project

START, END, NL = 1, 2, 3
ROLE = {"user": 10, "assistant": 12, "tool": 13, "system": 14}
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16, "seed": None, "n": 1}


def msg(role: str, *content: int) -> list[int]:
    """A rendered message: <start> role \\n content <end> \\n."""
    return [START, ROLE[role], NL, *content, END, NL]


GEN = [START, ROLE["assistant"], NL]  # the generation prompt


def choice(
    ids: list[int] | None,
    *,
    index: int = 0,
    content: str = "",
    finish: str = "stop",
    logprobs: list[float] | None | str = "auto",
) -> dict[str, Any]:
    lps = [-0.5] * len(ids or []) if logprobs == "auto" else logprobs
    return {
        "index": index,
        "token_ids": ids,
        "logprobs": lps,
        "finish_reason": finish,
        "message": {"role": "assistant", "content": content},
    }


def row(
    cid: str,
    prompt: list[int] | None,
    choices: list[dict[str, Any]],
    *,
    messages: list[dict[str, Any]] | None = None,
    parent: str | None = None,
    session: str = "s1",
    project: str = "p",
    task: str | None = None,
    tags: list[str] | None = None,
    adapter: int | None = None,
    alias: str = "agent",
    termination: str = "stop",
    at: int = 0,
    crid: str | None = None,
    endpoint: str = "chat",
) -> dict[str, Any]:
    """A completion row as a dict, ``at`` seconds after T0."""
    return {
        "id": cid,
        "project_id": project,
        "session_id": session,
        "task_id": task,
        "client_request_id": crid,
        "endpoint": endpoint,
        "alias": alias,
        "served_model": f"{alias}@v{adapter}" if adapter else "base",
        "adapter_version": adapter,
        "tags": tags or [],
        "request": {"model": alias, "messages": [{"role": "user", "content": "hi"}] if messages is None else messages},
        "response": {},
        "prompt_token_ids": prompt,
        "choices": choices,
        "sampling": dict(SAMPLING),
        "usage": None,
        "status_code": 200,
        "termination": termination,
        "error": None,
        "stream": False,
        "link_key": None,
        "parent_id": parent,
        "created_at": T0 + timedelta(seconds=at),
        "latency_ms": 1.0,
        "ttft_ms": 1.0,
    }


def new_project(db: Session, settings: dict[str, Any] | None = None) -> str:
    """A fresh project (the test database is shared by the whole run)."""
    pid = f"p-{uuid.uuid4().hex[:10]}"
    db.add(Project(id=pid, settings=settings or {}))
    db.flush()
    return pid


def insert(db: Session, *rows: dict[str, Any]) -> list[Completion]:
    objs = [Completion(**r) for r in rows]
    db.add_all(objs)
    db.flush()
    return objs


def feedback_row(
    project: str,
    name: str,
    value: Any = None,
    *,
    session: str | None = None,
    completion: str | None = None,
    pending_target: tuple[str, str] | None = None,
    source: str = "",
    comment: str | None = None,
    at: int = 0,
) -> Any:
    """A stored feedback row: attached to a completion/session, or pending on ``(kind, id)``."""
    from storage.feedback import new_feedback_id
    from storage.models import Feedback

    fid = new_feedback_id()
    kind, target = pending_target or (("completion_id", completion) if completion else ("session_id", session))
    return Feedback(
        id=fid,
        project_id=project,
        idempotency_key=fid,
        target_kind=kind,
        target_id=target,
        completion_id=None if pending_target else completion,
        session_id=None if pending_target else session,
        name=name,
        value=value,
        comment=comment,
        source=source,
        meta={},
        created_at=T0 + timedelta(seconds=at),
        attached_at=None if pending_target else T0,
    )
