"""One migration history: upgrade to head and downgrade to base on Postgres and SQLite."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect

from storage.db import sync_engine
from storage.migrate import downgrade, upgrade
from storage.models import Base

TABLES = set(Base.metadata.tables)


def _tables(url: str) -> set[str]:
    eng = sync_engine(url)
    try:
        return set(inspect(eng).get_table_names()) - {"alembic_version"}
    finally:
        eng.dispose()


def _roundtrip(url: str) -> None:
    upgrade(url)
    assert _tables(url) == TABLES
    downgrade(url)
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == TABLES


def test_postgres_upgrade_downgrade(pg_factory: object) -> None:
    _roundtrip(pg_factory(migrate=False))  # type: ignore[operator]


def test_sqlite_upgrade_downgrade_and_wal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    _roundtrip(url)
    eng = sync_engine(url)
    with eng.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
    eng.dispose()


def test_migrations_build_exactly_the_models_schema(pg_factory: object) -> None:
    """Every model change comes with a migration (autogenerate finds nothing left to do)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    eng = sync_engine(pg_factory())  # type: ignore[operator]
    try:
        with eng.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        eng.dispose()
    assert diff == []
