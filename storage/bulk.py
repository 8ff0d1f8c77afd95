"""Postgres bulk writes for the recorder, on a plain psycopg connection.

COPY for completions, one upsert for sessions, one query for pending
feedback: four round trips per batch and no per-row work beyond formatting. The
portable path (SQLAlchemy ``executemany`` with ``ON CONFLICT DO NOTHING``, a pool
checkout with a ping and an ORM session per batch) cost the proxy ~100 µs of CPU per
recorded call under load (bench/RESULTS.md). COPY has no ``ON CONFLICT``: a batch
that is already partly stored (a segment replayed after a crash between commit and
deletion) fails as a whole, and the caller writes it again the portable way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from psycopg import AsyncConnection

from storage.deletion import end_users_gone
from storage.records import COLUMNS, CallRecord

COPY = f"COPY completions ({', '.join(COLUMNS)}) FROM STDIN"
INSERT_PROJECTS = """
INSERT INTO projects (id, settings, created_at) SELECT p, '{}'::json, now() FROM unnest(%s::text[]) AS u(p)
ON CONFLICT (id) DO NOTHING
"""
# The batch's sessions as one JSON array: one orjson call here, one parse there (five text arrays
# cost ~10 µs a session to adapt). A NUL in a tag cannot become text: that batch goes the portable way.
UPSERT_SESSIONS = """
INSERT INTO sessions (project_id, id, task_id, source, tags, created_at, updated_at)
SELECT project_id, id, task_id, source, coalesce(tags, '[]'::json), now(), now()
FROM json_to_recordset(%s::json) AS s(project_id text, id text, task_id text, source text, tags json)
ON CONFLICT (project_id, id) DO UPDATE SET updated_at = excluded.updated_at
"""
# Deleted sessions and deleted end users of a batch, in one round trip (no end user named: the second part is empty).
# The sessions come as the upsert's JSON text, not as an array (adapting 500 ids cost ~2 µs each), and are
# looked up by the tombstones' primary key.
TOMBSTONED = """
SELECT t.project_id, t.session_id, NULL::text, NULL::timestamptz
FROM json_to_recordset(%s::json) AS s(project_id text, id text)
JOIN tombstones t ON t.project_id = s.project_id AND t.session_id = s.id
UNION ALL
SELECT project_id, NULL, end_user, created_at FROM end_user_tombstones WHERE end_user = ANY(%s::text[])
"""
TOMBSTONE = """
INSERT INTO tombstones (project_id, session_id, created_at)
SELECT p, s, now() FROM unnest(%s::text[], %s::text[]) AS u(p, s) ON CONFLICT DO NOTHING
"""
ANY_PENDING = "SELECT EXISTS (SELECT 1 FROM feedback WHERE attached_at IS NULL AND project_id = ANY(%s::text[]))"


async def insert_projects(conn: AsyncConnection[Any], project_ids: Iterable[str]) -> None:
    await conn.execute(INSERT_PROJECTS, [list(project_ids)])


async def copy_completions(conn: AsyncConnection[Any], records: list[CallRecord]) -> None:
    """COPY ``records`` into completions: one buffer of their lines (JSON columns as serialised when recorded)."""
    async with conn.cursor() as cur, cur.copy(COPY) as copy:
        await copy.write(b"\n".join([record.copy_line() for record in records]) + b"\n")


def sessions_json(calls: list[CallRecord]) -> str:
    """The sessions of these calls (one call each) as one JSON array: :func:`upsert_sessions` and :func:`tombstoned`."""
    return orjson.dumps([c.session_json_row() for c in calls]).decode()


async def upsert_sessions(conn: AsyncConnection[Any], sessions: str) -> None:
    """Insert these sessions (:func:`sessions_json`); touch ``updated_at`` of known ones (one statement)."""
    await conn.execute(UPSERT_SESSIONS, [sessions])


async def any_pending(conn: AsyncConnection[Any], project_ids: Iterable[str]) -> bool:
    """Whether any feedback of these projects waits for its target (answered by a partial index)."""
    cur = await conn.execute(ANY_PENDING, [list(project_ids)])
    row = await cur.fetchone()
    return bool(row and row[0])


async def tombstoned(conn: AsyncConnection[Any], sessions: str, calls: list[CallRecord]) -> set[tuple[str, str]]:
    """(project, session) pairs of these calls (``sessions``: theirs) that were deleted: their calls must not land."""
    users = list({c.end_user for c in calls if c.end_user is not None})
    cur = await conn.execute(TOMBSTONED, [sessions, users])
    rows = await cur.fetchall()
    gone = {(p, s) for p, s, _, _ in rows if s is not None}
    # A deleted end user's calls made before the delete: their sessions are tombstoned now.
    if new := end_users_gone(calls, [(p, u, t) for p, s, u, t in rows if s is None]) - gone:
        await conn.execute(TOMBSTONE, [[p for p, _ in new], [s for _, s in new]])
        gone |= new
    return gone
