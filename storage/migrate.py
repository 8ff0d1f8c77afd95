"""Run Alembic migrations programmatically (``onthejob db upgrade``), no alembic.ini needed.

On Postgres every upgrade and downgrade runs under one session-level advisory lock, held on its own
connection for the whole run: a migration Job, a second copy of it and each proxy replica's upgrade at
start (proxy/main.py) take turns, so two never race on the same DDL; the one that waited finds the
schema at head and does nothing. SQLite serialises writers itself.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from storage.db import database_url, sync_engine

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
# A signed 64-bit number from a fixed name: the same in every process and version of onthejob.
LOCK_KEY = int.from_bytes(hashlib.sha256(b"onthejob.migrate").digest()[:8], "big", signed=True)


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", database_url(url).replace("%", "%%"))
    return cfg


@contextlib.contextmanager
def migration_lock(url: str | None = None) -> Iterator[None]:
    """Hold the migration advisory lock on a connection of its own (Postgres: waits while another holds it)."""
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name != "postgresql":
                yield
                return
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                with contextlib.suppress(Exception):  # a broken connection: the server released the lock with it
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
                    conn.commit()
    finally:
        engine.dispose()


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the schema at ``url`` up to ``revision`` (default: head), under the migration lock."""
    with migration_lock(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    """Take the schema at ``url`` down to ``revision`` (default: base, an empty database), under the lock."""
    with migration_lock(url):
        command.downgrade(alembic_config(url), revision)
