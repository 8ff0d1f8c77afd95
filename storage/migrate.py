"""Run Alembic migrations programmatically (``onthejob db upgrade``), no alembic.ini needed."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from storage.db import database_url

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", database_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the schema at ``url`` up to ``revision`` (default: head)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    """Take the schema at ``url`` down to ``revision`` (default: base, an empty database)."""
    command.downgrade(alembic_config(url), revision)
