"""Database URLs, engines and session factories (sync for the trainer/CLI, async for the proxy).

Accepts the usual URL forms and picks the driver: ``postgresql://`` → psycopg 3
(sync and async), ``sqlite:///path`` → sqlite3 / aiosqlite. SQLite runs in WAL
mode with a busy timeout because the proxy and the trainer both write to it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DEFAULT_DB = "sqlite:///onthejob.db"
SQLITE_BUSY_MS = 10_000


class DatabaseUrlError(ValueError):
    """A database URL we cannot use; the message names the accepted forms."""


def database_url(url: str | None = None) -> str:
    """The URL to use: the argument, else ``DATABASE_URL``, else a SQLite file here."""
    return url or os.environ.get("DATABASE_URL") or DEFAULT_DB


def masked(url: str) -> str:
    """``url`` as it may be printed or logged: its password replaced by ``***`` (unparseable: only its scheme)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - sqlalchemy raises several kinds; show nothing that could be a secret
        scheme, sep, _ = url.partition("://")
        return f"{scheme}{sep}…" if sep else "…"


def libpq_url(url: str) -> str:
    """A Postgres URL as psycopg connects to it directly (``postgresql://…``, whatever driver it names)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def normalise(url: str, *, asynchronous: bool) -> str:
    """Rewrite a user URL to carry the driver we ship for sync or async use."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001 - sqlalchemy raises several kinds
        raise DatabaseUrlError(
            f"cannot parse database URL {masked(url)!r}: use postgresql://… or sqlite:///path"
        ) from exc
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite" if asynchronous else "sqlite")
    else:
        raise DatabaseUrlError(
            f"unsupported database {backend!r} in {masked(url)!r}: use postgresql://… or sqlite:///path"
        )
    return parsed.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def json_dumps(value: Any) -> str:
    # orjson: fast, and NaN becomes null (Postgres' json type refuses the bare NaN the stdlib writes).
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # integers past 64 bits (a client's metadata, say): the stdlib writes them exactly
        return json.dumps(value, default=str)


def json_loads(value: Any) -> Any:
    # SQLite hands back a JSON scalar (a bare number) as an int or float, not as text.
    return orjson.loads(value) if isinstance(value, str | bytes) else value


JSON_ARGS: dict[str, Any] = {"json_serializer": json_dumps, "json_deserializer": json_loads}


def sync_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """A sync engine (trainer, CLI, migrations)."""
    url = normalise(database_url(url), asynchronous=False)
    kwargs = {**JSON_ARGS, **kwargs}
    if is_sqlite(url):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def async_engine(url: str | None = None, **kwargs: Any) -> AsyncEngine:
    """An async engine (the proxy's recorder and read routes)."""
    url = normalise(database_url(url), asynchronous=True)
    kwargs = {**JSON_ARGS, **kwargs}
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000}, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_pre_ping=True, **kwargs)


def insert_for(dialect: str) -> Any:
    """``insert`` with ``ON CONFLICT`` for this database (``postgresql`` or ``sqlite``, the two we run on)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert
