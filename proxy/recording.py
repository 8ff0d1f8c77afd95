"""Where a served call's record goes: redaction, the fsync'd spool, metrics, and the link cache.

:class:`Recording` is everything :class:`proxy.calls.ProxiedCall` needs to keep what it
served, and nothing else: the call builds its record, this makes it durable
(fsync'd, :mod:`proxy.spool`) before the client's final byte, and the recorder
(:mod:`proxy.recorder`) moves it into the database later.
"""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.errors import Unavailable
from proxy.metrics import Metrics
from proxy.policies import Policies
from proxy.redact import RedactionPolicy, redact_record
from proxy.sessions import Link, Linker
from proxy.spool import Spool, SpoolFull
from storage.records import CallRecord

NATIVE = frozenset({"chat", "completions"})  # the OpenAI routes; anything else is a dialect


class Recording:
    """Keeps call records: ``enabled`` False serves without recording (counted all the same)."""

    def __init__(
        self,
        spool: Spool,
        linker: Linker,
        metrics: Metrics,
        *,
        enabled: bool,
        full_policy: str,
        wake_at: int,
        wake: asyncio.Event,
        policies: Policies,
    ) -> None:
        self.spool = spool
        self.linker = linker
        self.metrics = metrics
        self.enabled = enabled
        self.full_policy = full_policy  # "refuse": no unrecorded serving; "serve": serve and count the drop
        self.wake_at = wake_at
        self.wake = wake  # the recorder's: set when a full batch waits
        self.policies = policies  # per project, from the database (AppState.refresh) or the last copy on disk

    def check_policy(self, project: str) -> None:
        """Refuse a call up front (503) whose record could not be redacted: its project's policy is unknown."""
        if self.enabled:
            self.policies.get(project)

    def policy(self, project: str) -> RedactionPolicy:
        """The project's redaction policy (:class:`proxy.policies.PolicyUnknown`, a 503, when unknown)."""
        return self.policies.get(project)

    def redacted(self, policy: RedactionPolicy, fields: dict[str, Any]) -> dict[str, Any]:
        """A call's record fields under its project's :meth:`policy` (:func:`proxy.redact.redact_record`:
        text, and token ids a pattern spells); the choices' transient ``pieces`` are consumed either way."""
        return redact_record(fields, policy)

    def check_room(self) -> None:
        """Refuse a call up front when it could not be recorded (spool full under the refuse policy)."""
        if self.enabled and self.full_policy == "refuse" and self.spool.full:
            self.metrics.spool_full_rejections.inc()
            raise Unavailable(
                "the recording spool is full (database unreachable for too long?); retry later", code="spool_full"
            )

    def finished(
        self,
        route: str,
        dialect: str,
        status: int,
        termination: str,
        seconds: float,
        ttft_ms: float | None,
        usage: dict[str, Any] | None,
    ) -> None:
        """Count and time a call as it ends (recorded or not)."""
        usage = usage if isinstance(usage, dict) else {}
        self.metrics.observe_call(
            route,
            dialect,
            status,
            termination,
            seconds,
            ttft_ms / 1000 if ttft_ms is not None else None,
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
        )

    async def keep(self, record: CallRecord, link_keys: list[str | None]) -> None:
        """Fsync ``record`` (already :meth:`redacted`); then follow-ups can link to it by ``link_keys``."""
        try:
            line = await self.spool.append(record)
        except SpoolFull as exc:
            if self.full_policy == "serve":
                self.metrics.records_dropped.labels("spool_full").inc()
                return
            self.metrics.spool_full_rejections.inc()
            raise Unavailable(
                "the recording spool is full; the call was not served unrecorded. Retry later", code="spool_full"
            ) from exc
        # The recorder drains every 50 ms on its own; waking it per call made it run one database
        # transaction per request (most of the proxy's CPU at concurrency 1). Wake it early only
        # when a full batch is waiting.
        if self.spool.depth >= self.wake_at:
            self.wake.set()
        self.linker.remember(
            record.project_id,
            link_keys,
            Link(record.session_id, record.id, record.task_id, record.end_user, record.created_at),
        )
        if record.dialect not in NATIVE:
            self.linker.recent.put(record.project_id, record.id, line)  # continuable by id from this moment
