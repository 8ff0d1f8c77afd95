"""Postgres bulk writes for the recorder: COPY for completions, one ``unnest`` upsert for sessions.

The portable path (SQLAlchemy ``executemany`` with ``ON CONFLICT DO NOTHING``) cost
the proxy ~70 µs of CPU per recorded call under load: every JSON column bound per row
and each statement re-converted by the driver. COPY sends the rows in Postgres' own
text format instead (bench/RESULTS.md). COPY has no ``ON CONFLICT``: a batch that is
already partly stored (a segment replayed after a crash between commit and deletion)
fails as a whole, and the caller writes it again the portable way.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON
from sqlalchemy.ext.asyncio import AsyncConnection

from storage.db import json_dumps
from storage.models import Completion

COLUMNS = tuple(c.name for c in Completion.__table__.columns)
JSON_COLUMNS = frozenset(c.name for c in Completion.__table__.columns if isinstance(c.type, JSON))

UPSERT_SESSIONS = """
INSERT INTO sessions (project_id, id, task_id, source, tags, created_at, updated_at)
SELECT p, i, t, s, g::json, now(), now()
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[]) AS u(p, i, t, s, g)
ON CONFLICT (project_id, id) DO UPDATE SET updated_at = excluded.updated_at
"""


async def copy_completions(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    """COPY ``rows`` (dicts keyed by column, as the portable insert takes them) into completions."""
    columns = [c for c in COLUMNS if c in rows[0]]
    driver = (await conn.get_raw_connection()).driver_connection
    async with driver.cursor() as cur, cur.copy(f"COPY completions ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            await copy.write_row([json_dumps(row.get(c)) if c in JSON_COLUMNS else row.get(c) for c in columns])


async def upsert_sessions(conn: AsyncConnection, sessions: list[dict[str, Any]]) -> None:
    """Insert new sessions; touch ``updated_at`` of known ones (one statement, arrays as parameters)."""
    columns: list[list[Any]] = [[], [], [], [], []]
    for s in sessions:
        for i, value in enumerate((s["project_id"], s["id"], s.get("task_id"), s["source"], s.get("tags") or [])):
            columns[i].append(value)
    columns[4] = [json_dumps(tags) for tags in columns[4]]
    driver = (await conn.get_raw_connection()).driver_connection
    async with driver.cursor() as cur:
        await cur.execute(UPSERT_SESSIONS, columns)
