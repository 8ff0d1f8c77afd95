"""Postgres bulk writes for the recorder, on a plain psycopg connection.

COPY for completions, one upsert for sessions, one query for what must not land
and for pending feedback: four round trips per batch with the commit, and no
per-row work beyond formatting (storage/records.py builds each COPY line). The
portable path (SQLAlchemy ``executemany`` with ``ON CONFLICT DO NOTHING``, a pool
checkout with a ping and an ORM session per batch) cost the proxy ~100 µs of CPU per
recorded call under load (bench/journal/2026-11-30.md, P7). COPY has no ``ON CONFLICT``: a batch
that is already partly stored (a segment replayed after a crash between commit and
deletion) fails as a whole, and the caller writes it again the portable way.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson
from psycopg import AsyncConnection

from storage.deletion import Deleted, clock_offset, end_users_gone
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
# What a batch must know before its COPY, in one round trip: its deleted sessions and their deletes' times,
# its deleted end users (none named: that part is empty), the database's clock (the row with no project),
# and, as one row flagged ``pending``, whether feedback of its projects waits for its call. The sessions
# come as the upsert's JSON text, not as an array (adapting 500 ids cost ~2 µs each), and are looked up by
# the tombstones' primary key.
CHECKS = """
SELECT t.project_id, t.session_id, NULL::text, t.created_at, false
FROM json_to_recordset(%s::json) AS s(project_id text, id text)
JOIN tombstones t ON t.project_id = s.project_id AND t.session_id = s.id
UNION ALL
SELECT project_id, NULL, end_user, created_at, false FROM end_user_tombstones WHERE end_user = ANY(%s::text[])
UNION ALL
SELECT NULL, NULL, NULL, clock_timestamp(), false
UNION ALL
SELECT NULL, NULL, NULL, NULL, true
WHERE EXISTS (SELECT 1 FROM feedback WHERE attached_at IS NULL AND project_id = ANY(%s::text[]))
"""
# A deleted end user's session found at drain time: tombstoned with the end user's time (a later one kept).
TOMBSTONE = """
INSERT INTO tombstones (project_id, session_id, created_at)
SELECT p, s, t FROM unnest(%s::text[], %s::text[], %s::timestamptz[]) AS u(p, s, t)
ON CONFLICT (project_id, session_id) DO UPDATE SET created_at = greatest(tombstones.created_at, excluded.created_at)
"""
# Sessions whose calls this batch dropped, unless a call made after the delete is stored (a fresh session).
DROP_EMPTY = """
DELETE FROM sessions s USING unnest(%s::text[], %s::text[]) AS u(p, i)
WHERE s.project_id = u.p AND s.id = u.i
AND NOT EXISTS (SELECT 1 FROM completions c WHERE c.project_id = u.p AND c.session_id = u.i)
"""


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


async def checks(
    conn: AsyncConnection[Any], sessions: str, calls: list[CallRecord], project_ids: Iterable[str]
) -> tuple[Deleted, bool]:
    """What of these calls (``sessions``: theirs) was deleted, and must not land (:class:`Deleted`: the deletes'
    times by the database's clock, and its lead over ours); and whether feedback of these projects waits for its
    target (the pending part: a partial index).
    """
    users = list({c.end_user for c in calls if c.end_user is not None})
    sent = datetime.now(UTC)
    cur = await conn.execute(CHECKS, [sessions, users, list(project_ids)])
    rows = await cur.fetchall()
    answered = datetime.now(UTC)
    gone, deleted_users, pending, db_now = Deleted(), [], False, None
    for p, s, u, t, flag in rows:
        if flag:
            pending = True
        elif p is None:
            db_now = t
        elif s is not None:
            gone.times[(p, s)] = t
        else:
            deleted_users.append((p, u, t))
    if db_now is not None:
        gone.offset = clock_offset(db_now, sent, answered)
    # A deleted end user's calls made before the delete: their sessions are tombstoned now, with its time.
    if new := end_users_gone(calls, deleted_users, gone.offset):
        await conn.execute(TOMBSTONE, [[p for p, _ in new], [s for _, s in new], list(new.values())])
        gone.merge(new)
    return gone, pending


PARENTS_PRESENT = "SELECT id FROM completions WHERE id = ANY(%s) FOR KEY SHARE"


async def parents_present(conn: AsyncConnection[Any], ids: list[str]) -> set[str]:
    """Which of these committed calls still exist, each held against deletion until the transaction ends
    (``FOR KEY SHARE``: a session delete or a retention pass that takes one waits): the parents the delta
    rows being inserted refer to (storage/stored_form.py)."""
    if not ids:
        return set()
    cur = await conn.execute(PARENTS_PRESENT, [ids])
    return {row[0] for row in await cur.fetchall()}


async def drop_empty(conn: AsyncConnection[Any], sessions: Iterable[tuple[str, str]]) -> None:
    """Remove these sessions' rows where no call of theirs is stored (:data:`DROP_EMPTY`)."""
    pairs = list(sessions)
    if pairs:
        await conn.execute(DROP_EMPTY, [[p for p, _ in pairs], [s for _, s in pairs]])
