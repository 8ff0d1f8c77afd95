"""A stored call found by its id from the moment its last byte was sent: memory, sibling spools, database.

``previous_response_id`` (and ``GET /v1/responses/{id}``) name a call that may have
ended a millisecond ago on another worker of this host, and be in no database yet.
The same three places session linking looks serve here: this worker's recent dialect
records (kept as spooled, parsed only when asked for), the spools of this worker and
its siblings (the record is fsync'd there before the client's last byte, and a record
drained from there is in the database), then the database. Memory is only the fast
path, so it is bounded in bytes as well as in calls. Another project's id looks
exactly like an unknown one.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable

import orjson
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from proxy.dialects.base import Stored
from storage.models import Completion
from storage.records import CallRecord

# Spool records (this worker's and its siblings') whose line holds any of these byte strings (newest first).
SpoolScan = Callable[[list[bytes]], Iterable[CallRecord]]
# Memory for this worker's recent lines (~300 Responses calls of ~3 kB); past it a continuation is
# read from the spools or the database. bench.dialect_cpu saw no CPU effect of the bound either way.
RECENT_BYTES = 1024 * 1024
COLUMNS = (
    "id",
    "project_id",
    "session_id",
    "task_id",
    "dialect",
    "status_code",
    "request",
    "choices",
    "client_request",
    "client_response",
)


class RecentCalls:
    """This worker's recent dialect calls by (project, id), as spooled; bounded, oldest dropped first.

    Each is kept as its spool line: one bytes object, where the whole record kept ~20 (ids,
    times, each JSON column) alive for the next 4,096 calls, interleaved in the allocator's
    pools with every call's short-lived objects. A line is parsed only when asked for (one
    ``orjson.loads``; the record's ``row()`` parsed each JSON column).
    """

    def __init__(self, size: int = 4096, max_bytes: int = RECENT_BYTES) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    def put(self, project: str, call_id: str, line: bytes) -> None:
        """Keep a call's spool line (:meth:`storage.records.CallRecord.encode`)."""
        old = self._items.pop((project, call_id), None)
        self._items[(project, call_id)] = line
        self.bytes += len(line) - (len(old) if old is not None else 0)
        while len(self._items) > self.size or (self.bytes > self.max_bytes and len(self._items) > 1):
            self.bytes -= len(self._items.popitem(last=False)[1])

    def get(self, project: str, call_id: str) -> Stored | None:
        line = self._items.get((project, call_id))
        return Stored.from_record(orjson.loads(line)["completion"]) if line is not None else None


def id_needle(call_id: str) -> bytes:
    """The bytes a spool line holds for a record with this id (``"id"``, not ``"parent_id"``)."""
    return b'"id":"' + call_id.encode() + b'"'


def stored(record: CallRecord) -> Stored:
    return Stored.from_record(record.row())


async def find(
    project: str,
    call_id: str,
    *,
    recent: RecentCalls,
    spools: SpoolScan,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> Stored | None:
    """The call ``call_id`` of ``project``, wherever it is now; None if unknown (or another project's)."""
    kept = recent.get(project, call_id)
    if kept is not None:
        return kept
    for record in spools([id_needle(call_id)]):
        if record.id == call_id:
            return stored(record) if record.project_id == project else None
    query = select(*(getattr(Completion, c) for c in COLUMNS)).where(
        Completion.id == call_id, Completion.project_id == project
    )
    async with asyncio.timeout(5.0), sessionmaker() as db:
        row = (await db.execute(query)).first()
    return Stored.from_record(dict(row._mapping)) if row is not None else None
